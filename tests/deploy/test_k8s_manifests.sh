#!/usr/bin/env bash
# deploy/k8s: yamllint (Debian package yamllint), `kubectl kustomize` where a kubectl is installed
# (Debian's kubernetes-client 1.20 validates schemas only against a live API server, so nothing
# here can check them offline; kustomize still parses every object), and the facts the manifests
# promise, read with the YAML parser yamllint brings:
#  - the ConfigMap's agent.json passes wf-agent --check-config;
#  - the agent's memory request covers host_budget (the floors are charged to the agent's pod);
#  - workers run as the uid the agent allows, with the floor group as supplementary group only,
#    request a GPU, and share the agent's floor and socket hostPaths (the floor read-only);
#  - every container has liveness and readiness probes on /healthz and /readyz of its port.
. "${WF_SOURCE_DIR:?}/tests/install/lib.sh"
K8S=$WF_SOURCE_DIR/deploy/k8s
if ! command -v yamllint >/dev/null; then
	echo "SKIP: yamllint not installed (scripts/setup.sh installs it)"
	exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check "yamllint -s deploy/k8s" yamllint -s -c "$K8S/.yamllint" "$K8S"
if command -v kubectl >/dev/null; then
	check "kubectl kustomize deploy/k8s" bash -c "kubectl kustomize '$K8S' >'$tmp/all.yaml'"
else
	echo "kubectl not installed: kustomize not checked"
fi

python3 - "$K8S" "$tmp" <<'PY' || fail "manifest facts (above)"
import json, os, re, sys, yaml
k8s, tmp = sys.argv[1], sys.argv[2]
docs = {}
for f in sorted(os.listdir(k8s)):
    if f.endswith(".yaml") and f != "kustomization.yaml":
        for d in yaml.safe_load_all(open(os.path.join(k8s, f))):
            if d:
                docs[(d["kind"], d["metadata"]["name"])] = d
bad = []
def want(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        bad.append(what)
def size(s):
    m = re.fullmatch(r"(\d+)([KMGT]i?)?", s)
    return int(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ")[0])
cfg = json.loads(docs[("ConfigMap", "wf-agent-config")]["data"]["agent.json"])
open(os.path.join(tmp, "agent.json"), "w").write(json.dumps(cfg))
agent = docs[("DaemonSet", "wf-agent")]["spec"]["template"]["spec"]
worker = docs[("Deployment", "wf-worker")]["spec"]["template"]["spec"]
ac, wc = agent["containers"][0], worker["containers"][0]
mem = size(ac["resources"]["requests"]["memory"])
want(mem >= size(cfg["host_budget"]), "agent memory request %s covers host_budget %s"
     % (ac["resources"]["requests"]["memory"], cfg["host_budget"]))
want(ac["resources"]["limits"]["memory"] == ac["resources"]["requests"]["memory"],
     "agent memory limit equals its request")
ws = worker["securityContext"]
want(ws["runAsUser"] in cfg["allowed_uids"], "the agent allows the workers' uid")
want(ws["runAsGroup"] != int(cfg["group"]) and ws["supplementalGroups"] == [int(cfg["group"])],
     "workers have the floor group as supplementary group only")
want(agent["securityContext"]["runAsGroup"] == int(cfg["group"]), "the agent runs in the floor group")
want(wc["resources"]["limits"].get("nvidia.com/gpu") == 1, "a worker requests one GPU")
want(worker["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
     ["topologyKey"] == "kubernetes.io/hostname", "workers run on a node with an agent")
def host(spec, name):
    return [v["hostPath"]["path"] for v in spec["volumes"] if v["name"] == name][0]
def mount(c, name):
    return [m for m in c["volumeMounts"] if m["name"] == name][0]
for v in ("floor", "run"):
    want(host(agent, v) == host(worker, v), "agent and workers share the %s hostPath" % v)
want(mount(wc, "floor").get("readOnly") is True, "workers mount the floor read-only")
want(mount(ac, "floor")["mountPath"] == cfg["floor_dir"], "the agent's floor mount is floor_dir")
want(cfg["socket"] == "ipc://" + mount(ac, "run")["mountPath"] + "/agent.sock",
     "the agent's socket is on the run mount")
for c in (ac, wc):
    port = [p["containerPort"] for p in c["ports"] if p["name"] == "metrics"][0]
    want(c["args"][c["args"].index("--metrics") + 1] == "0.0.0.0:%d" % port,
         "%s --metrics listens on its metrics port %d" % (c["name"], port))
    want(c["livenessProbe"]["httpGet"]["path"] == "/healthz"
         and c["readinessProbe"]["httpGet"]["path"] == "/readyz", c["name"] + " probes")
    sc = c["securityContext"]
    want(sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
         and sc["readOnlyRootFilesystem"] is True, c["name"] + " drops every capability")
sys.exit(1 if bad else 0)
PY

# The ConfigMap's configuration as wf-agent reads it (group 900 may not exist here: ours instead).
sed "s/\"group\": \"900\"/\"group\": \"$(id -g)\"/" "$tmp/agent.json" >"$tmp/agent-here.json"
check "the ConfigMap's agent.json passes wf-agent --check-config" "$WF_BUILD_DIR/agent/wf-agent" \
	-c "$tmp/agent-here.json" --check-config --floor-dir "$tmp/floor" --socket "ipc://$tmp/a.sock" \
	--events "ipc://$tmp/e.sock" --state-file none
finish
