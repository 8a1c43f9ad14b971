"""Issue 23, item 3: ``poprun-py render --backend k8s`` writes a JobSet, or an Indexed Job with a
headless Service, whose pods run ``poprun-py launch --per-node``.

The manifests are checked strictly against the Kubernetes API: every key of the rendered YAML
must be a field of the ``kubernetes`` client's model for its place (its ``attribute_map`` and
``openapi_types``, recursively), and the client must build the objects from it (its required
fields). The JobSet CRD has no model in that client: its own fields are checked against
:data:`JOBSET`, written from the upstream types, and its Job template against
``V1JobTemplateSpec``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s  # the test extra's: the models of the Kubernetes API

from poprun_py.cli import run
from poprun_py.core.hosts import expand_names, parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.core.topology import uniform
from poprun_py.errors import RenderError
from poprun_py.prepare.job import free_port
from poprun_py.render.k8s import SECRET_FILE, Request, job_name, resources

ROOT = Path(__file__).resolve().parents[2]
POD16 = ROOT / "clusters" / "pod16.yaml"
IMAGE = "registry.example/train:1"
SECRET_VALUE = "correct horse battery staple, never in a manifest"

# The JobSet v1alpha2 API, from kubernetes-sigs/jobset, api/jobset/v1alpha2/jobset_types.go
# (types JobSet, JobSetSpec, ReplicatedJob, DependsOn, Network, FailurePolicy,
# FailurePolicyRule, SuccessPolicy, StartupPolicy, Coordinator, VolumeClaimPolicy): each
# field's JSON name, and its type (a client model's name, a Python type, [item] or {field}).
_RULE = {
    "name": str,
    "action": str,
    "onJobFailureReasons": [str],
    "onJobFailureMessagePatterns": [str],
    "targetReplicatedJobs": [str],
}
_REPLICATED_JOB = {
    "name": str,
    "groupName": str,
    "template": "V1JobTemplateSpec",
    "replicas": int,
    "dependsOn": [{"name": str, "status": str}],
}
JOBSET: dict[str, Any] = {
    "apiVersion": str,
    "kind": str,
    "metadata": "V1ObjectMeta",
    "spec": {
        "replicatedJobs": [_REPLICATED_JOB],
        "network": {"enableDNSHostnames": bool, "subdomain": str, "publishNotReadyAddresses": bool},
        "successPolicy": {"operator": str, "targetReplicatedJobs": [str]},
        "failurePolicy": {"maxRestarts": int, "restartStrategy": str, "rules": [_RULE]},
        "startupPolicy": {"startupPolicyOrder": str},
        "suspend": bool,
        "coordinator": {"replicatedJob": str, "jobIndex": int, "podIndex": int},
        "managedBy": str,
        "ttlSecondsAfterFinished": int,
        "volumeClaimPolicies": [
            {"templates": ["V1PersistentVolumeClaim"], "retentionPolicy": {"whenDeleted": str}}
        ],
    },
}
_PRIMITIVES: Mapping[str, Any] = {
    "str": str,
    "int": int,
    "bool": bool,
    "float": (int, float),
    "object": object,
    "datetime": str,
    "date": str,
}


# ---------------------------------------------------------------- strict validation


def check_model(data: Any, model: str, path: str) -> None:
    """Every key of ``data`` is a field of the client's ``model``, recursively; the client
    builds the model from it (required fields present)."""
    cls = getattr(k8s, model)
    assert isinstance(data, dict), f"{path}: {model} expects a mapping, got {data!r}"
    fields = {key: attr for attr, key in cls.attribute_map.items()}
    for key, value in data.items():
        assert key in fields, f"{path}.{key}: not a field of {model}"
        check_type(value, cls.openapi_types[fields[key]], f"{path}.{key}")
    k8s.ApiClient()._ApiClient__deserialize(data, model)  # raises on a missing required field


def check_type(value: Any, kind: str, path: str) -> None:
    """``value`` is of the client's type ``kind`` (``List[X]``, ``Dict[str, X]``, a model)."""
    inner = kind.partition("[")[2][:-1] or kind.partition("(")[2][:-1]
    if kind.lower().startswith("list"):
        assert isinstance(value, list), f"{path}: a list expected"
        for i, item in enumerate(value):
            check_type(item, inner, f"{path}[{i}]")
    elif kind.lower().startswith("dict"):
        assert isinstance(value, dict), f"{path}: a mapping expected"
        for key, item in value.items():
            check_type(item, inner.partition(",")[2].strip(), f"{path}.{key}")
    elif kind in _PRIMITIVES:
        assert isinstance(value, _PRIMITIVES[kind]), f"{path}: {kind} expected, got {value!r}"
    else:
        check_model(value, kind, path)


def check_schema(data: Any, schema: Any, path: str) -> None:
    """``data`` against a field list such as :data:`JOBSET`."""
    if isinstance(schema, str):
        check_model(data, schema, path)
    elif isinstance(schema, list):
        assert isinstance(data, list), f"{path}: a list expected"
        for i, item in enumerate(data):
            check_schema(item, schema[0], f"{path}[{i}]")
    elif isinstance(schema, dict):
        assert isinstance(data, dict), f"{path}: a mapping expected"
        for key, value in data.items():
            assert key in schema, f"{path}.{key}: not a field of the JobSet API"
            check_schema(value, schema[key], f"{path}.{key}")
    else:
        assert isinstance(data, schema), f"{path}: {schema.__name__} expected, got {data!r}"


def test_the_validation_catches_a_stray_key() -> None:
    pod = {"containers": [{"name": "c", "image": "i", "commnd": ["x"]}]}
    with pytest.raises(AssertionError, match=r"spec.containers\[0\].commnd: not a field"):
        check_model(pod, "V1PodSpec", "spec")
    with pytest.raises(
        AssertionError, match=r"spec\.network\.hostnames: not a field of the JobSet"
    ):
        check_schema({"spec": {"network": {"hostnames": True}}}, JOBSET, "")
    with pytest.raises(Exception, match="name"):
        check_model({"image": "i"}, "V1Container", "c")  # its name is required


# ---------------------------------------------------------------- rendering


def render(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run(["render", "--backend", "k8s", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def manifest(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    code, out, err = render(capsys, "--image", IMAGE, *args)
    assert code == 0, err
    return [d for d in yaml.safe_load_all(out) if d is not None]


def pod_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod template's spec of a JobSet or a Job."""
    if doc["kind"] == "JobSet":
        doc = doc["spec"]["replicatedJobs"][0]["template"]
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def container(doc: dict[str, Any]) -> dict[str, Any]:
    [one] = pod_of(doc)["containers"]
    return dict(one)


def env(doc: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(doc)["env"]}


def test_the_jobset_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    [jobset] = manifest(capsys, "-c", str(POD16), "train.py", "--lr", "0.1")
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    check_schema(jobset, JOBSET, "JobSet")
    [rjob] = jobset["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"]) == ("Indexed", 16, 16)
    assert job["backoffLimit"] == 0  # a failed pod fails its Job: JobSet restarts them all
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True


def test_the_indexed_job_and_its_headless_service_are_valid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    service, job = manifest(capsys, "--k8s-kind", "job", "-c", str(POD16), "train.py")
    assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    check_model(service, "V1Service", "Service")
    check_model(job, "V1Job", "Job")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert pod_of(job)["subdomain"] == service["metadata"]["name"]
    assert (job["spec"]["completionMode"], job["spec"]["completions"]) == ("Indexed", 16)


@pytest.mark.parametrize("kind", ["jobset", "job"])
def test_the_pods_run_launch_per_node_on_every_pod_s_name(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = manifest(capsys, "--k8s-kind", kind, "--k8s-name", "bert", "-H", "a,b,c", "-r", "6",
                    "train.py", "--lr", "0.1")  # fmt: skip
    command = container(docs[-1])["command"]
    assert command[:4] == ["poprun-py", "launch", "--per-node", "--hosts"]
    # the names Kubernetes gives the pods: JobSet's <jobset>-<replicatedJob>-<jobIndex>-
    # <podIndex>.<subdomain>, the Indexed Job's <job>-<index>.<service>
    expected = {
        "jobset": ["bert-node-0-0.bert", "bert-node-0-1.bert", "bert-node-0-2.bert"],
        "job": ["bert-0.bert", "bert-1.bert", "bert-2.bert"],
    }[kind]
    assert expand_names(command[4]) == expected
    assert [h.name for h in parse_hosts(command[4])] == expected
    if kind == "jobset":
        [rjob] = docs[0]["spec"]["replicatedJobs"]
        assert (docs[0]["metadata"]["name"], rjob["name"]) == ("bert", "node")
        assert docs[0]["spec"]["network"]["subdomain"] == "bert"
    assert command[command.index("--") :] == ["--", "train.py", "--lr", "0.1"]
    assert "--replicas=6" in command and "--instances=3" in command


@pytest.mark.parametrize("kind", ["jobset", "job"])
def test_rank_nnodes_and_coordinator_come_from_the_environment(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = manifest(capsys, "--k8s-kind", kind, "-H", "a,b", "-r", "2", "train.py")
    values = env(docs[-1])
    hosts = expand_names(container(docs[-1])["command"][4])
    assert values == {"POPRUN_NNODES": "2", "POPRUN_COORDINATOR": hosts[0]}
    # the rank: JOB_COMPLETION_INDEX, which Kubernetes sets in every pod of an Indexed Job
    job = docs[-1] if kind == "job" else docs[0]["spec"]["replicatedJobs"][0]["template"]
    assert job["spec"]["completionMode"] == "Indexed"
    command = container(docs[-1])["command"]
    assert not any(w.startswith(("--node-rank", "--nnodes", "--coordinator")) for w in command)


def test_resources_come_from_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    [jobset] = manifest(capsys, "-c", str(POD16), "train.py")
    asks = container(jobset)["resources"]
    assert asks["requests"] == asks["limits"] == {"cpu": "128", "nvidia.com/gpu": "16"}
    command = container(jobset)["command"]  # the spec's sizes, for pods without the spec
    sizes = {"--replicas=64", "--instances=16", "--devices-per-replica=4", "--group-size=4"}
    assert sizes | {"--numa-aware"} <= set(command)
    assert not any(w.startswith(("--cluster", "-c", "--backend")) for w in command)
    [bare] = manifest(capsys, "-H", "a,b", "-r", "2", "train.py")  # no topology declared
    assert "resources" not in container(bare)


@pytest.mark.parametrize(
    ("program", "name"),
    [
        (("python3", "/src/Train_BERT.py", "--epochs", "10"), "poprun-train-bert"),
        (("./run.sh", "x"), "poprun-run-sh"),
        (("python3", "-m", "pkg.main"), "poprun-pkg-main"),
        (("sh", "-c", "echo $RANK"), "poprun-sh"),
        (("python3",), "poprun-python3"),
    ],
)
def test_the_default_name_is_the_program_s(program: tuple[str, ...], name: str) -> None:
    assert job_name(Request("i"), program) == name


def plan_with(*topologies: Any) -> LaunchPlan:
    names = ",".join(f"h{i}" for i in range(len(topologies)))
    plan = make_plan(
        cluster_from_hosts(parse_hosts(names)), JobSpec(("t",), replicas=len(topologies))
    )
    hosts = tuple(dataclasses.replace(h, topology=t) for h, t in zip(plan.hosts, topologies))
    return dataclasses.replace(plan, hosts=hosts)


def test_amd_devices_and_hosts_that_differ() -> None:
    amd = dataclasses.replace(uniform(2, 8, 4), device_kind="amd")
    assert resources(plan_with(amd, amd)) == {"cpu": "16", "amd.com/gpu": "8"}
    assert resources(plan_with(uniform(1, 4), uniform(1, 4))) == {"cpu": "4"}
    with pytest.raises(RenderError, match="host h1 needs cpu=8, host h0 cpu=4: one pod"):
        resources(plan_with(uniform(1, 4), uniform(2, 4)))


@pytest.mark.parametrize("kind", ["jobset", "job"])
def test_the_secret_is_mounted_never_inlined(
    kind: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POPRUN_SECRET", SECRET_VALUE)
    monkeypatch.setenv("MY_TOKEN", SECRET_VALUE)
    code, out, err = render(capsys, "--k8s-kind", kind, "--image", IMAGE, "-H", "a,b", "-r", "2",
                            "-e", "MY_TOKEN", "-e", "PLAIN=1", "train.py")  # fmt: skip
    assert code == 0, err
    assert SECRET_VALUE not in out
    doc = [d for d in yaml.safe_load_all(out) if d][-1]
    command = container(doc)["command"]
    assert f"--secret-file={SECRET_FILE}" in command
    assert "--env=MY_TOKEN" in command and "--env=PLAIN=1" in command  # by name: the pod's
    [mount] = container(doc)["volumeMounts"]
    [volume] = pod_of(doc)["volumes"]
    assert mount == {"name": volume["name"], "mountPath": "/var/run/poprun", "readOnly": True}
    assert volume["secret"]["secretName"] == "poprun-secret"
    assert volume["secret"]["items"] == [{"key": "secret", "path": "secret"}]
    assert SECRET_FILE == "/var/run/poprun/secret"


def test_max_restarts_are_kubernetes_whole_job_restarts(capsys: pytest.CaptureFixture[str]) -> None:
    [jobset] = manifest(capsys, "--max-restarts", "3", "-H", "a,b", "-r", "2", "train.py")
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 3}
    assert "--max-restarts=0" in container(jobset)["command"]  # none inside the pods
    [_, job] = manifest(capsys, "--k8s-kind", "job", "--max-restarts", "3", "-H", "a,b", "-r",
                        "2", "train.py")  # fmt: skip
    assert (job["spec"]["backoffLimitPerIndex"], job["spec"]["maxFailedIndexes"]) == (3, 0)
    assert "--max-restarts=0" in container(job)["command"]
    [none] = manifest(capsys, "-H", "a", "train.py")
    assert none["spec"]["failurePolicy"] == {"maxRestarts": 0}


def test_the_pods_command_is_a_launch_the_cli_takes(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    from poprun_py.cli.app import app

    [jobset] = manifest(capsys, "-c", str(POD16), "--max-restarts", "2", "--timeout", "2h",
                        "-e", "A=b c", "train.py", "--lr", "0.1")  # fmt: skip
    command = container(jobset)["command"]
    launch = typer.main.get_command(app).commands["launch"]  # type: ignore[attr-defined]
    ctx = launch.make_context("launch", list(command[2:]), resilient_parsing=True)
    assert ctx.params["per_node"] is True and ctx.params["timeout"] is not None
    assert tuple(ctx.params["program"]) == ("train.py", "--lr", "0.1")
    assert "A=b c" in ctx.params["env"]


def test_two_pods_run_the_rendered_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pods' command and environment, as written, run the job: two processes here stand
    for two pods (their names, the Secret's path and the ports made local)."""
    [jobset] = manifest(capsys, "-H", "a,b", "-r", "2", "--", "sh", "-c", "echo rank $RANK")
    argv = [sys.executable, "-m", "poprun_py", *container(jobset)["command"][1:]]
    argv[argv.index("--hosts") + 1] = "127.0.0.1,localhost"
    # hosts of this machine get a free MASTER_PORT each (pods' names get 29500): the same here
    argv.insert(argv.index("--"), f"--master-port={free_port()}")
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    secret.chmod(0o600)
    argv = [w.replace(SECRET_FILE, str(secret)) for w in argv]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("POPRUN_", "PET_"))}
    clean = {k: v for k, v in clean.items() if not k.startswith(("SLURM_", "OMPI_"))}
    base = {**clean, **env(jobset), "POPRUN_COORDINATOR": f"127.0.0.1:{free_port()}"}
    base["PYTHONPATH"] = str(ROOT)
    pods = [
        subprocess.Popen(
            argv,
            env={**base, "JOB_COMPLETION_INDEX": str(rank)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for rank in range(2)
    ]
    try:
        outputs = [pod.communicate(timeout=90) for pod in pods]
    finally:
        for pod in pods:
            pod.kill()
    assert [pod.returncode for pod in pods] == [0, 0], outputs
    assert "rank 0" in outputs[0][0] and "rank 1" in outputs[0][0], outputs


def test_templates_override_the_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from poprun_py.render.environment import TEMPLATES_DIR

    pod = (TEMPLATES_DIR / "pernode-pod.j2").read_text(encoding="utf-8")
    mine = pod.replace(
        "  restartPolicy: Never\n", "  restartPolicy: Never\n  nodeSelector: {pool: gpu}\n"
    )
    assert mine != pod
    (tmp_path / "pernode-pod.j2").write_text(mine, encoding="utf-8")
    [jobset] = manifest(capsys, "--templates", str(tmp_path), "-H", "a", "train.py")
    assert pod_of(jobset)["nodeSelector"] == {"pool": "gpu"}
    check_schema(jobset, JOBSET, "JobSet")


def test_json_is_the_same_objects_as_one_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = render(capsys, "--image", IMAGE, "--k8s-kind", "job", "-H", "a", "-f",
                            "json", "train.py")  # fmt: skip
    assert code == 0, err
    listed = json.loads(out)
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    assert [i["kind"] for i in listed["items"]] == ["Service", "Job"]
    check_model(listed["items"][1], "V1Job", "Job")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-H", "a", "t"), "render --backend k8s needs --image IMAGE"),
        (("--image", IMAGE, "--k8s-kind", "pod", "-H", "a", "t"),
         "--k8s-kind must be jobset or job, got 'pod'"),
        (("--image", IMAGE, "--k8s-name", "Bad_Name", "-H", "a", "t"),
         "--k8s-name 'Bad_Name': Kubernetes needs lower-case"),
        (("--image", IMAGE, "--k8s-name", "x" * 60, "-H", "a", "t"), "at most 63 characters"),
        (("--image", IMAGE, "--k8s-name", "9lives", "-H", "a", "t"), "from a letter"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(
    args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = render(capsys, *args)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("command", ["launch", "check"])
def test_launch_and_check_refuse_k8s_in_one_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run([command, "--backend", "k8s", "-H", "a", "true"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == (
        "poprun-py: error: k8s is rendered, not launched: poprun-py render --backend k8s ... "
        "> job.yaml, then kubectl apply -f job.yaml"
    )


def test_a_spec_default_backend_k8s_is_refused_by_launch_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "k8s.yaml"
    spec.write_text("name: c\nhosts: [{name: h1}]\ndefaults: {backend: k8s}\n")
    assert run(["launch", "-c", str(spec), "true"]) == 2
    assert "k8s is rendered, not launched" in capsys.readouterr().err
    assert run(["render", "-c", str(spec), "--image", IMAGE, "true"]) == 0
    assert "kind: JobSet" in capsys.readouterr().out


def test_the_readme_s_commands_render(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if x.startswith("poprun-py render --backend k8s"))
    argv = shlex.split(line.partition(">")[0])[1:]
    argv = [str(POD16) if a == "clusters/pod16.yaml" else a for a in argv]
    assert run(argv) == 0, capsys.readouterr().err
    assert "kind: JobSet" in capsys.readouterr().out


# ---------------------------------------------------------------- memory (issue 23)

MEMORY_SPEC = """\
name: mem
hosts:
  - {name: "n[1-2]", topology: big}
topologies:
  big:
    numa_nodes:
      - {id: 0, cpus: "0-7", devices: [0, 1], memory: 48Gi}
      - {id: 1, cpus: "8-15", devices: [2, 3], memory: 48Gi}
"""


@pytest.mark.parametrize("kind", ["jobset", "job"])
def test_memory_is_the_numa_nodes_together_and_the_manifest_stays_valid(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "mem.yaml"
    spec.write_text(MEMORY_SPEC, encoding="utf-8")
    docs = manifest(capsys, "--k8s-kind", kind, "-c", str(spec), "train.py")
    asks = container(docs[-1])["resources"]
    expected = {"cpu": "16", "memory": "96Gi", "nvidia.com/gpu": "4"}
    assert asks["requests"] == asks["limits"] == expected
    if kind == "jobset":
        check_schema(docs[0], JOBSET, "JobSet")
    else:
        check_model(docs[-1], "V1Job", "Job")
    check_model(asks, "V1ResourceRequirements", "resources")


def test_memory_is_absent_when_the_topology_does_not_declare_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    [jobset] = manifest(capsys, "-c", str(POD16), "train.py")
    assert "memory" not in container(jobset)["resources"]["limits"]
    assert resources(plan_with(uniform(2, 4, 1), uniform(2, 4, 1))) == {
        "cpu": "8",
        "nvidia.com/gpu": "2",
    }


def with_memory(topology: Any, *sizes: int) -> Any:
    nodes = tuple(
        dataclasses.replace(n, memory=m) for n, m in zip(topology.numa_nodes, sizes, strict=True)
    )
    return dataclasses.replace(topology, numa_nodes=nodes)


def test_memory_is_written_in_the_unit_of_the_smallest_whole_number() -> None:
    gib, gb = 2**30, 10**9
    assert resources(plan_with(with_memory(uniform(2, 4), 48 * gib, 48 * gib)))["memory"] == "96Gi"
    assert resources(plan_with(with_memory(uniform(2, 4), 256 * gb, 256 * gb)))["memory"] == "512G"
    assert resources(plan_with(with_memory(uniform(2, 4), 512 * gib, 512 * gib)))["memory"] == "1Ti"


def test_hosts_that_differ_in_memory_are_refused() -> None:
    gib = 2**30
    small, big = with_memory(uniform(2, 4), gib, gib), with_memory(uniform(2, 4), gib, 3 * gib)
    assert resources(plan_with(small, small))["memory"] == "2Gi"
    with pytest.raises(
        RenderError, match="host h1 needs cpu=8, memory=4Gi, host h0 cpu=8, memory=2Gi: one pod"
    ):
        resources(plan_with(small, big))
    with pytest.raises(RenderError, match="host h1 needs cpu=8, host h0 cpu=8, memory=2Gi"):
        resources(plan_with(small, uniform(2, 4)))  # one host's memory unknown: not the same


def test_hosts_that_differ_in_memory_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "mem.yaml"
    other = (
        '  small:\n    numa_nodes:\n      - {cpus: "0-15", devices: [0, 1, 2, 3], memory: 64Gi}\n'
    )
    text = MEMORY_SPEC.replace('{name: "n[1-2]", topology: big}', "{name: n1, topology: big}")
    text = text.replace("hosts:\n", "hosts:\n  - {name: n2, topology: small}\n") + other
    spec.write_text(text, encoding="utf-8")
    code, out, err = render(capsys, "--image", IMAGE, "-c", str(spec), "train.py")
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1, err
    assert "memory=96Gi" in err and "memory=64Gi" in err and "one pod template" in err
