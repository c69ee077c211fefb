"""Structural schema check of deploy/kubernetes/*.yaml (no cluster needed).

Checks the subset of the Kubernetes API (v1 PersistentVolumeClaim, batch/v1 Job; field names and types
as in the API reference, https://kubernetes.io/docs/reference/kubernetes-api/) that the manifests use:
every mapping's keys are known (a misspelt field is an error, as `kubectl apply --validate=strict`
makes it), types match, the shard Job is Indexed with completions == parallelism == SHARDS, the
container runs `attnref generate --shard "$JOB_COMPLETION_INDEX/$SHARDS"`, the merge Job lists exactly
the shard directories 0..N-1, and every volume mount names a defined volume backed by the PVC.
Usage: kubernetes_check.py DIR. Exit 0 when valid, 1 with one line per problem otherwise.
"""
import pathlib
import sys

import yaml

STR, INT, LIST, MAP = str, int, list, dict
# field -> type, or a nested schema (dict) for mappings, or [schema] for lists of mappings.
CONTAINER = {"name": STR, "image": STR, "command": [STR], "args": [STR], "workingDir": STR,
             "env": [{"name": STR, "value": STR}],
             "resources": {"requests": {"cpu": STR, "memory": STR}, "limits": {"cpu": STR, "memory": STR}},
             "volumeMounts": [{"name": STR, "mountPath": STR, "readOnly": bool}]}
POD_SPEC = {"restartPolicy": STR, "containers": [CONTAINER],
            "volumes": [{"name": STR, "persistentVolumeClaim": {"claimName": STR, "readOnly": bool}}]}
METADATA = {"name": STR, "labels": {}, "namespace": STR}
SCHEMAS = {
    ("v1", "PersistentVolumeClaim"): {"apiVersion": STR, "kind": STR, "metadata": METADATA,
                                      "spec": {"accessModes": [STR], "storageClassName": STR,
                                               "resources": {"requests": {"storage": STR}}}},
    ("batch/v1", "Job"): {"apiVersion": STR, "kind": STR, "metadata": METADATA,
                          "spec": {"completionMode": STR, "completions": INT, "parallelism": INT, "backoffLimit": INT,
                                   "backoffLimitPerIndex": INT, "ttlSecondsAfterFinished": INT,
                                   "template": {"metadata": METADATA, "spec": POD_SPEC}}},
}


def check(value, schema, path, problems):
    if isinstance(schema, type):
        if not isinstance(value, schema) or (schema is int and isinstance(value, bool)):
            problems.append(f"{path}: expected {schema.__name__}, got {type(value).__name__}")
    elif isinstance(schema, list):
        if not isinstance(value, list):
            problems.append(f"{path}: expected a list")
            return
        for i, item in enumerate(value):
            check(item, schema[0], f"{path}[{i}]", problems)
    elif isinstance(schema, dict):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a mapping")
            return
        if schema == {}:  # free-form string map (labels)
            return
        for key, item in value.items():
            if key not in schema:
                problems.append(f"{path}.{key}: unknown field")
            else:
                check(item, schema[key], f"{path}.{key}", problems)


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    problems, docs = [], []
    for f in sorted(root.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(f.read_text())):
            key = (doc.get("apiVersion"), doc.get("kind"))
            where = f"{f.name}[{i}] {key[1]}"
            if key not in SCHEMAS:
                problems.append(f"{where}: unsupported apiVersion/kind {key}")
                continue
            check(doc, SCHEMAS[key], where, problems)
            for req in ("apiVersion", "kind", "metadata", "spec"):
                if req not in doc:
                    problems.append(f"{where}.{req}: missing")
            docs.append((where, doc))
    jobs = {d["metadata"]["name"]: (w, d) for w, d in docs if d["kind"] == "Job"}
    claims = {d["metadata"]["name"] for _, d in docs if d["kind"] == "PersistentVolumeClaim"}
    for w, d in jobs.values():
        pod = d["spec"]["template"]["spec"]
        if pod.get("restartPolicy") not in ("Never", "OnFailure"):
            problems.append(f"{w}.spec.template.spec.restartPolicy: a Job needs Never or OnFailure")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for v in volumes.values():
            if v["persistentVolumeClaim"]["claimName"] not in claims:
                problems.append(f"{w}: volume {v['name']} names an undefined claim")
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    problems.append(f"{w}: container {c['name']} mounts undefined volume {m['name']}")
    shards = jobs.get("attnref-shards")
    merge = jobs.get("attnref-merge")
    if not shards or not merge:
        problems.append("expected Jobs attnref-shards and attnref-merge")
    else:
        w, d = shards
        spec = d["spec"]
        env = {e["name"]: e["value"] for e in spec["template"]["spec"]["containers"][0].get("env", [])}
        n = int(env.get("SHARDS", "0"))
        if spec.get("completionMode") != "Indexed":
            problems.append(f"{w}.spec.completionMode: expected Indexed")
        if not (spec.get("completions") == spec.get("parallelism") == n > 0):
            problems.append(f"{w}: completions, parallelism and SHARDS must be equal and positive")
        text = " ".join(d["spec"]["template"]["spec"]["containers"][0].get("command", []) +
                        d["spec"]["template"]["spec"]["containers"][0].get("args", []))
        if '--shard "$JOB_COMPLETION_INDEX/$SHARDS"' not in text or "attnref generate" not in text:
            problems.append(f"{w}: the container must run attnref generate --shard \"$JOB_COMPLETION_INDEX/$SHARDS\"")
        command = merge[1]["spec"]["template"]["spec"]["containers"][0]["command"]
        dirs = [a for a in command if a.startswith("/work/shards/") and a[len("/work/shards/"):].isdigit()]
        if command[:2] != ["attnref", "merge"] or dirs != [f"/work/shards/{i}" for i in range(n)]:
            problems.append(f"{merge[0]}: the merge command must list /work/shards/0 .. /work/shards/{n - 1}")
    for p in problems:
        print(p)
    print(f"{len(docs)} documents, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
