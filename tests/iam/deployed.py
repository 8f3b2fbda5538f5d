"""template.yaml as SAM deploys it, for the IAM check: translated to plain CloudFormation by
aws-sam-translator (offline: SAM ships its own map of AWS managed policies, and a session
with a region is all it asks of boto3), its intrinsics resolved against sample parameters,
and every principal's policy documents collected: each role's inline policies, the managed
policies it has (the template's own, and AWS's whose text is kept here), and the policies
that name it from elsewhere; the executor's policy as a principal of its own.

Physical names are what CloudFormation makes for a resource it names itself
(`<stack>-<LogicalId>-<suffix>`, the suffix here a stable digest), and `Ref` and `GetAtt`
answer what CloudFormation documents for each type (a log group's `Arn` ends in `:*`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from cfn_tools import load_yaml
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator

from seedkeeper_tools.infra import ROOT

TEMPLATE = ROOT / "template.yaml"
ACCOUNT = "123456789012"
REGION = "eu-west-1"
PARTITION = "aws"
STACK = "seedkeeper"

# A deployment's values for the parameters with no default, and for the optional ones whose
# branches the check should see (R2 configured, an alarm topic).
PARAMETERS: dict[str, Any] = {
    "R2AccountId": "0123456789abcdef0123456789abcdef",
    "R2Bucket": "seedkeeper-backups",
    "R2SecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:r2-write-AbCdEf",
    "R2ReadSecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:r2-read-AbCdEf",
    "SlotRepository": "seedkeeper-slot",
    "SlotImageTag": "1",
    "SlotImage": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/seedkeeper-slot:1",  # before 0.2
    "SubnetIds": ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"],
    "VpcId": "vpc-0123456789abcdef0",
    "RouteTableIds": ["rtb-0123456789abcdef0"],
    "AlarmTopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:seedkeeper-alarms",
}

# The AWS managed policies SAM attaches by itself, with their text (they are not in the
# template): the basic execution role, which a function gets unless it names a role.
AWS_MANAGED: dict[str, dict[str, Any]] = {
    f"arn:{PARTITION}:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole": {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": "*",
            }
        ],
    }
}


@dataclass(frozen=True)
class Principal:
    arn: str
    policies: tuple[tuple[str, Mapping[str, Any]], ...]  # (name, document)


@dataclass(frozen=True)
class Deployed:
    """The resolved stack: each resource's reference and attributes, each principal."""

    refs: Mapping[str, Any]
    attributes: Mapping[str, Mapping[str, Any]]
    resources: Mapping[str, Any]  # each as deployed: its intrinsics resolved
    principals: Mapping[str, Principal]
    # Each function's folder under functions/ → its logical id and its role's.
    functions: Mapping[str, str]
    roles: Mapping[str, str]

    def arn(self, logical_id: str, attribute: str = "Arn") -> str:
        return str(self.attributes[logical_id][attribute])

    def url_target(self, function: str) -> str:
        """What a call through the URL of `function` (its folder under functions/) is
        authorized against: the URL's target, qualified when it is an alias's; the
        function's own ARN when it has no URL."""
        arn = self.arn(self.functions[function])
        for resource in self.resources.values():
            if resource["Type"] == "AWS::Lambda::Url":
                target = str(resource["Properties"]["TargetFunctionArn"])
                if target == arn or target.startswith(f"{arn}:"):
                    return target
        return arn

    def ref(self, logical_id: str) -> str:
        return str(self.refs[logical_id])

    def parameter(self, name: str) -> Any:
        return self.refs[name]

    def environment(self, function: str) -> dict[str, str]:
        """The environment the function (its folder under functions/) runs with."""
        properties = self.resources[self.functions[function]]["Properties"]
        return {name: str(value) for name, value in properties["Environment"]["Variables"].items()}


def translated(
    template: Path = TEMPLATE, parameters: Mapping[str, Any] = PARAMETERS
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The SAM template, the CloudFormation SAM makes of it, and the parameters given."""
    sam = json.loads(json.dumps(load_yaml(template.read_text())))
    declared = sam.get("Parameters", {})
    values = {name: value for name, value in parameters.items() if name in declared}
    cloudformation = Translator(
        {}, Parser(), boto_session=boto3.session.Session(region_name=REGION)
    ).translate(
        _packaged(sam),
        parameter_values={**values, "AWS::Region": REGION, "AWS::AccountId": ACCOUNT},
        get_managed_policy_map=dict,
    )
    return sam, cloudformation, values


def deploy(template: Path = TEMPLATE, parameters: Mapping[str, Any] = PARAMETERS) -> Deployed:
    sam, cloudformation, values = translated(template, parameters)
    resolver = _Resolver(cloudformation, values)
    resources = {lid: resolver.resolve(resource) for lid, resource in resolver.resources.items()}
    functions, roles = {}, {}
    for lid, resource in resources.items():
        if resource["Type"] != "AWS::Lambda::Function":
            continue
        folder = sam["Resources"][lid]["Properties"]["CodeUri"].removeprefix("functions/")
        functions[folder.rstrip("/")] = lid
        role_arn = resource["Properties"]["Role"]
        roles[folder.rstrip("/")] = next(
            role for role, attrs in resolver.atts.items() if attrs.get("Arn") == role_arn
        )
    return Deployed(
        refs=resolver.refs | resolver.params,
        attributes=resolver.atts,
        resources=resources,
        principals=_principals(resolver, resources),
        functions=functions,
        roles=roles,
    )


def _packaged(sam: dict[str, Any]) -> dict[str, Any]:
    """What `sam package` hands CloudFormation: code locations in S3."""
    packaged = copy.deepcopy(sam)
    for lid, resource in packaged.get("Resources", {}).items():
        properties = resource.get("Properties", {})
        for key in ("CodeUri", "ContentUri"):
            if isinstance(properties.get(key), str):
                properties[key] = f"s3://sam-artifacts-{ACCOUNT}/{STACK}/{lid}.zip"
    return packaged


def _name(logical_id: str) -> str:
    suffix = hashlib.sha256(logical_id.encode()).hexdigest()[:12].upper()
    return f"{STACK}-{logical_id}"[: 64 - 13] + f"-{suffix}"


def _arn(service: str, resource: str) -> str:
    return f"arn:{PARTITION}:{service}:{REGION}:{ACCOUNT}:{resource}"


class _NoValue:
    pass


NO_VALUE = _NoValue()


class _Resolver:
    def __init__(self, template: dict[str, Any], parameters: Mapping[str, Any]) -> None:
        self.template = template
        self.params: dict[str, Any] = {}
        for name, declared in template.get("Parameters", {}).items():
            listed = declared["Type"].startswith("List<") or declared["Type"].endswith("List")
            value = parameters.get(name, declared.get("Default", [] if listed else None))
            if value is None:
                raise KeyError(f"parameter {name} has no value")
            if listed and not isinstance(value, list):
                value = [part for part in str(value).split(",") if part]
            self.params[name] = value if listed else str(value)
        self.pseudo = {
            "AWS::AccountId": ACCOUNT,
            "AWS::Region": REGION,
            "AWS::Partition": PARTITION,
            "AWS::StackName": STACK,
            "AWS::URLSuffix": "amazonaws.com",
        }
        self.conditions: dict[str, bool] = {}
        self.refs: dict[str, Any] = {}
        self.atts: dict[str, dict[str, Any]] = {}
        self.resources = {
            lid: resource
            for lid, resource in template["Resources"].items()
            if "Condition" not in resource or self.condition(resource["Condition"])
        }
        for lid, resource in self.resources.items():
            self._name(lid, resource)

    def condition(self, name: str) -> bool:
        if name not in self.conditions:
            self.conditions[name] = bool(self.resolve(self.template["Conditions"][name]))
        return self.conditions[name]

    def _name(self, lid: str, resource: dict[str, Any]) -> None:
        kind, properties, name = resource["Type"], resource.get("Properties", {}), _name(lid)
        ref: Any = name
        atts: dict[str, Any] = {}
        if kind == "AWS::DynamoDB::Table":
            atts = {"Arn": _arn("dynamodb", f"table/{name}")}
        elif kind == "AWS::Lambda::Function":
            atts = {"Arn": _arn("lambda", f"function:{name}")}
        elif kind in {"AWS::Lambda::Version", "AWS::Lambda::Alias"}:
            # SAM's AutoPublishAlias: a version (the first: 1), the alias naming it; each
            # Ref is the function's ARN qualified by it.
            function = _arn("lambda", f"function:{_name(properties['FunctionName']['Ref'])}")
            qualifier = "1" if kind == "AWS::Lambda::Version" else properties["Name"]
            ref = f"{function}:{qualifier}"
            atts = {"Version": "1"} if kind == "AWS::Lambda::Version" else {}
        elif kind == "AWS::Lambda::Url":
            atts = {"FunctionUrl": f"https://{name.lower()[-12:]}.lambda-url.{REGION}.on.aws/"}
        elif kind == "AWS::IAM::Role":
            path = properties.get("Path", "/")
            atts = {"Arn": f"arn:{PARTITION}:iam::{ACCOUNT}:role{path}{name}"}
        elif kind == "AWS::IAM::ManagedPolicy":
            ref = f"arn:{PARTITION}:iam::{ACCOUNT}:policy/{name}"
        elif kind == "AWS::Logs::LogGroup":
            atts = {"Arn": _arn("logs", f"log-group:{name}:*")}
        elif kind == "AWS::ECS::Cluster":
            atts = {"Arn": _arn("ecs", f"cluster/{name}")}
        elif kind == "AWS::ECS::TaskDefinition":
            family = self.resolve(properties.get("Family", name))
            ref = _arn("ecs", f"task-definition/{family}:1")
        elif kind == "AWS::SQS::Queue":
            ref = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{name}"
            atts = {"Arn": _arn("sqs", name), "QueueName": name}
        elif kind == "AWS::EC2::SecurityGroup":
            ref = "sg-" + hashlib.sha256(lid.encode()).hexdigest()[:17]
            atts = {"GroupId": ref}
        self.refs[lid] = ref
        self.atts[lid] = atts

    def ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        for table in (self.pseudo, self.params, self.refs):
            if name in table:
                return table[name]
        raise KeyError(f"Ref to {name}: unknown, or a resource whose condition is false")

    def attribute(self, lid: str, name: str) -> Any:
        try:
            return self.atts[lid][name]
        except KeyError:
            raise KeyError(f"GetAtt {lid}.{name}: not modelled") from None

    def sub(self, argument: Any) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        resolved = {key: self.resolve(value) for key, value in variables.items()}

        def value(match: re.Match[str]) -> str:
            expression = match.group(1)
            if expression.startswith("!"):
                return "${" + expression[1:] + "}"
            if expression in resolved:
                return str(resolved[expression])
            if "." in expression and not expression.startswith("AWS::"):
                lid, name = expression.split(".", 1)
                return str(self.attribute(lid, name))
            return str(self.ref(expression))

        return re.sub(r"\$\{([^}]+)\}", value, text)

    def resolve(self, node: Any) -> Any:  # noqa: PLR0912 - one case per intrinsic
        if isinstance(node, list):
            return [item for item in map(self.resolve, node) if item is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, argument),) = node.items()
            if key == "Ref":
                return self.ref(argument)
            if key == "Fn::GetAtt":
                lid, name = argument.split(".", 1) if isinstance(argument, str) else argument
                return self.attribute(lid, name)
            if key == "Fn::Sub":
                return self.sub(argument)
            if key == "Fn::Join":
                separator, items = argument
                return separator.join(str(item) for item in self.resolve(items))
            if key == "Fn::Select":
                return self.resolve(argument[1])[int(self.resolve(argument[0]))]
            if key == "Fn::Split":
                return str(self.resolve(argument[1])).split(argument[0])
            if key == "Fn::If":
                condition, chosen, other = argument
                return self.resolve(chosen if self.condition(condition) else other)
            if key == "Fn::Equals":
                first, second = (self.resolve(value) for value in argument)
                return first == second if isinstance(first, list) else str(first) == str(second)
            if key == "Fn::Not":
                return not self.resolve(argument[0])
            if key == "Fn::And":
                return all(self.resolve(value) for value in argument)
            if key == "Fn::Or":
                return any(self.resolve(value) for value in argument)
            if key == "Condition" and isinstance(argument, str):
                return self.condition(argument)
        resolved = {key: self.resolve(value) for key, value in node.items()}
        return {key: value for key, value in resolved.items() if value is not NO_VALUE}


def _principals(resolver: _Resolver, resources: Mapping[str, Any]) -> dict[str, Principal]:
    """Each role with every policy that applies to it; the template's managed policies
    meant for someone outside the stack (the executor's) as principals of their own."""
    managed = {
        resolver.refs[lid]: (lid, resource["Properties"]["PolicyDocument"])
        for lid, resource in resources.items()
        if resource["Type"] == "AWS::IAM::ManagedPolicy"
    }
    role_ids = {
        resolver.refs[lid]: lid for lid, r in resources.items() if r["Type"] == "AWS::IAM::Role"
    }
    Documents = list[tuple[str, Mapping[str, Any]]]
    policies: dict[str, Documents] = {lid: [] for lid in role_ids.values()}
    attached: set[str] = set()
    for lid, resource in resources.items():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::IAM::Role":
            for inline in properties.get("Policies", []):
                policies[lid].append((inline["PolicyName"], inline["PolicyDocument"]))
            for arn in properties.get("ManagedPolicyArns", []):
                if arn in managed:
                    attached.add(managed[arn][0])
                    policies[lid].append(managed[arn])
                else:
                    policies[lid].append((arn.rsplit("/", 1)[-1], AWS_MANAGED[arn]))
        elif resource["Type"] in {"AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"}:
            for role in properties.get("Roles", []):
                attached.add(lid)
                policies[role_ids[role]].append((lid, properties["PolicyDocument"]))
        elif resource["Type"] == "AWS::IAM::RolePolicy":
            role = role_ids[properties["RoleName"]]
            policies[role].append((properties["PolicyName"], properties["PolicyDocument"]))
    found = {
        lid: Principal(resolver.atts[lid]["Arn"], tuple(documents))
        for lid, documents in policies.items()
    }
    for lid, document in managed.values():
        if lid not in attached:  # handed out: its holder is a principal of its own
            holder = f"arn:{PARTITION}:iam::{ACCOUNT}:role/{lid}-holder"
            found[lid] = Principal(holder, ((lid, document),))
    return found
