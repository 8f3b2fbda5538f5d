"""A Fargate cluster in moto (in-process or the moto server), as the slot tasks' runtime
settings name it: ECS's own behaviour where moto has it, its refusals played by a
Stubber where it does not."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from seedkeeper.adapters.runtime import RuntimeSettings

if TYPE_CHECKING:
    from mypy_boto3_ecs import ECSClient


def fargate_cluster(ec2: Any, ecs: ECSClient) -> RuntimeSettings:
    # The default VPC: moto's ECS wants DNS hostnames for the task's network interface.
    (vpc,) = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc["VpcId"]]}])
    subnet = subnets["Subnets"][0]["SubnetId"]
    # Named anew each time: the moto server is shared by every test of a session.
    name = f"slots-{uuid.uuid4().hex[:8]}"
    group = ec2.create_security_group(GroupName=name, Description="slots", VpcId=vpc["VpcId"])
    ecs.create_cluster(clusterName="seedkeeper")
    ecs.register_task_definition(
        family="seedkeeper-slot",
        requiresCompatibilities=["FARGATE"],
        networkMode="awsvpc",
        cpu="1024",
        memory="2048",
        containerDefinitions=[
            {"name": "slot", "image": "seedkeeper-slot-task", "memoryReservation": 1024}
        ],
    )
    return RuntimeSettings(
        runtime="ecs",
        cluster="seedkeeper",
        task_definition="seedkeeper-slot",
        subnets=(subnet,),
        security_groups=(group["GroupId"],),
    )
