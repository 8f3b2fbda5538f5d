"""`sam local invoke` against a running `seedkeeper local`, on Linux with a Docker engine.

SAM runs a function in a container of the Lambda Python base image, with the variables its
template declares and no others: an `--env-vars` file can only set those. Pointing the
functions at a local stack needs variables only a local stack sets (its store's endpoint and
keys), so SAM builds them from the local template (`local_template`): template.yaml with
those variables declared for every function, this machine's architecture (the deployed
arm64 runs elsewhere only under emulation) and absolute code paths. The environment file
(`sam_environment`) gives every declared variable its value, so nothing of the caller's
shell reaches a function: SAM prefers a shell variable to the template's value.

SAM's containers do not share the host's network, whatever `--docker-network host` says
(SAM skips that network: aws/aws-sam-cli#3609), and the stack's store listens on loopback.
So while the environment file is in use a relay forwards the Docker bridge's address on
this host to the store (`serve_sam_env`), and the file names the relay.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import platform
import socket
import socketserver
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from seedkeeper.errors import SeedkeeperError
from seedkeeper_tools.infra import ROOT, load_template

FUNCTION = "AWS::Serverless::Function"
LAYER = "AWS::Serverless::LayerVersion"
# Declared for every function in the local template: what points it at the stack. The AWS
# ones replace what SAM would pass, the caller's own credentials and region.
LOCAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "SEEDKEEPER_DYNAMODB_ENDPOINT",
    "SEEDKEEPER_R2_ENDPOINT",
    "SEEDKEEPER_R2_ACCESS_KEY_ID",
    "SEEDKEEPER_R2_SECRET_ACCESS_KEY",
    "SEEDKEEPER_R2_READ_ACCESS_KEY_ID",
    "SEEDKEEPER_R2_READ_SECRET_ACCESS_KEY",
)
# Declared too wherever a function names its slot runtime: where the local one keeps slots.
RUNTIME_VARIABLES = ("SEEDKEEPER_DATA_DIR",)
# What a local stack sets (`seedkeeper_tools.local.stack`), passed on as it is; the
# endpoints are passed as the containers reach them.
FROM_STACK = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "SEEDKEEPER_TABLE",
    "SEEDKEEPER_R2_BUCKET",
    "SEEDKEEPER_R2_ACCESS_KEY_ID",
    "SEEDKEEPER_R2_SECRET_ACCESS_KEY",
    "SEEDKEEPER_R2_READ_ACCESS_KEY_ID",
    "SEEDKEEPER_R2_READ_SECRET_ACCESS_KEY",
    "SEEDKEEPER_RUNTIME",
    "SEEDKEEPER_DATA_DIR",
    "SEEDKEEPER_IDLE_WINDOW",
    "SEEDKEEPER_PARK_RETENTION",
    "SEEDKEEPER_TASK_ROLE_ARN",
)
ENDPOINTS = ("SEEDKEEPER_DYNAMODB_ENDPOINT", "SEEDKEEPER_R2_ENDPOINT")
# What a local stack has none of: R2's account and secret (it hands out keys), ECS.
NOT_LOCAL = {
    "AWS_SESSION_TOKEN": "",
    "SEEDKEEPER_R2_ACCOUNT_ID": "",
    "SEEDKEEPER_R2_SECRET_ARN": "",
    "SEEDKEEPER_R2_READ_SECRET_ARN": "",
    "SEEDKEEPER_CLUSTER": "",
    "SEEDKEEPER_TASK_DEFINITION": "",
    "SEEDKEEPER_SUBNETS": "[]",  # JSON lists, parsed even where unused
    "SEEDKEEPER_SECURITY_GROUPS": "[]",
    "SEEDKEEPER_ASSIGN_PUBLIC_IP": "false",
}
# Lambda's names for this machine's architecture.
ARCHITECTURES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}


class DockerUnavailable(SeedkeeperError):
    """No Docker engine answers, or its containers cannot reach this host."""


def function_ids(template: Mapping[str, Any]) -> list[str]:
    return [
        name for name, resource in template["Resources"].items() if resource["Type"] == FUNCTION
    ]


def lambda_architecture(machine: str | None = None) -> str:
    """Lambda's name for the architecture of `machine` (default: this one)."""
    machine = machine or platform.machine()
    if machine.lower() not in ARCHITECTURES:
        raise ValueError(f"Lambda has no architecture for {machine}")
    return ARCHITECTURES[machine.lower()]


def local_template(
    template: Mapping[str, Any], architecture: str, root: Path = ROOT
) -> dict[str, Any]:
    """`template` as `sam build` builds it for `sam local invoke` on this machine."""
    local: dict[str, Any] = copy.deepcopy(dict(template))
    function_globals = local["Globals"]["Function"]
    function_globals["Architectures"] = [architecture]
    variables = function_globals.setdefault("Environment", {}).setdefault("Variables", {})
    variables.update(dict.fromkeys(LOCAL_VARIABLES, ""))
    for resource in local["Resources"].values():
        properties = resource.get("Properties", {})
        if resource["Type"] == FUNCTION:
            properties["CodeUri"] = str((root / properties["CodeUri"]).resolve())
            if "Architectures" in properties:
                properties["Architectures"] = [architecture]
            own = properties.get("Environment", {}).get("Variables", {})
            if "SEEDKEEPER_RUNTIME" in own:
                own.update(dict.fromkeys(RUNTIME_VARIABLES, ""))
        elif resource["Type"] == LAYER:
            properties["ContentUri"] = str((root / properties["ContentUri"]).resolve())
            properties["CompatibleArchitectures"] = [architecture]
            resource.get("Metadata", {})["BuildArchitecture"] = architecture
    return local


def write_local_template(path: Path, architecture: str | None = None) -> None:
    local = local_template(load_template(), architecture or lambda_architecture())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(local, indent=2) + "\n")


def sam_environment(
    stack: Mapping[str, str], template: Mapping[str, Any], endpoints: Mapping[str, str]
) -> dict[str, dict[str, str]]:
    """The `--env-vars` file for every function of `template` (a local template): each
    variable it declares, valued from `stack` (a local stack's environment), else as a
    local stack has none of it, else as the template says. `endpoints` maps the stack's
    store endpoints to the ones the containers reach."""
    values = {name: stack[name] for name in FROM_STACK if name in stack}
    values |= {name: endpoints[stack[name]] for name in ENDPOINTS}
    values["AWS_REGION"] = stack["AWS_DEFAULT_REGION"]
    environment: dict[str, dict[str, str]] = {}
    for function in function_ids(template):
        environment[function] = {}
        for name, declared in _declared(template, function).items():
            value = values.get(name, NOT_LOCAL.get(name, _template_value(template, declared)))
            if value is None:
                raise ValueError(f"{function} declares {name}: no local value for it")
            environment[function][name] = value
    return environment


@contextmanager
def serve_sam_env(path: Path, stack: Mapping[str, str]) -> Iterator[None]:
    """While open: the stack's store relayed to the Docker bridge, and the environment file
    for it at `path` (it holds the store's keys: readable by its owner only)."""
    bridge = bridge_address()
    with ExitStack() as relays:
        endpoints: dict[str, str] = {}
        for endpoint in {stack[name] for name in ENDPOINTS}:
            relay = relays.enter_context(Relay(bridge, endpoint))
            endpoints[endpoint] = relay.endpoint
        environment = sam_environment(
            stack, local_template(load_template(), lambda_architecture()), endpoints
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(json.dumps(environment, indent=2) + "\n")
        yield


def bridge_address() -> str:
    """This host's address on Docker's default bridge: where its containers reach it."""
    try:
        inspected = subprocess.run(
            ["docker", "network", "inspect", "bridge", "--format", "{{json .IPAM.Config}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError as error:
        raise DockerUnavailable(f"no docker command: {error}") from error
    if inspected.returncode != 0:
        raise DockerUnavailable(f"no Docker engine answers: {inspected.stderr.strip()}")
    subnet = ipaddress.ip_network(json.loads(inspected.stdout)[0]["Subnet"])
    # The address this host sends from into the bridge's subnet (a UDP connect sends nothing).
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((str(subnet.network_address + 2), 9))
        address: str = probe.getsockname()[0]
    if ipaddress.ip_address(address) not in subnet:
        raise DockerUnavailable(f"this host has no address on Docker's bridge {subnet}")
    return address


class Relay:
    """Forwards every connection to a port on `host` to `endpoint`'s host and port."""

    def __init__(self, host: str, endpoint: str) -> None:
        target = urlsplit(endpoint)
        if target.hostname is None or target.port is None:
            raise ValueError(f"not an endpoint with a host and port: {endpoint}")
        self._scheme = target.scheme
        self._server = _RelayServer((host, 0), (target.hostname, target.port))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.socket.getsockname()[:2]
        return f"{self._scheme}://{host}:{port}"

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class _RelayServer(socketserver.ThreadingTCPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], target: tuple[str, int]) -> None:
        super().__init__(address, _Forward)
        self.target = target


class _Forward(socketserver.BaseRequestHandler):
    server: _RelayServer

    def handle(self) -> None:
        with socket.create_connection(self.server.target, timeout=30) as upstream:
            upstream.settimeout(None)
            back = threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)
            back.start()
            _pump(self.request, upstream)
            back.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copies until `source` ends, then ends `sink`'s side (HTTP's half-close included)."""
    with suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _declared(template: Mapping[str, Any], function: str) -> dict[str, Any]:
    shared = template["Globals"]["Function"].get("Environment", {}).get("Variables", {})
    properties = template["Resources"][function]["Properties"]
    own = properties.get("Environment", {}).get("Variables", {})
    return {**shared, **own}


def _template_value(template: Mapping[str, Any], value: Any) -> str | None:
    """A literal, or a parameter's default: what SAM gives a variable without an override."""
    if isinstance(value, Mapping) and set(value) == {"Ref"}:
        value = template.get("Parameters", {}).get(value["Ref"], {}).get("Default")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str | int | float):
        return str(value)
    return None
