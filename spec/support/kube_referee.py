"""The referee of the kubernetes specs: Debian's python3-kubernetes, run against the same fake
API server and with the same kubeconfig files as sandkit, saying what it saw as JSON.

    python3 kube_referee.py ANSWERS

reads one request a line on stdin, a JSON array [KUBECONFIG, ACTION, ARGS...], and appends one
JSON line to the file ANSWERS for each, in order, until stdin ends. One process serves a whole
spec file: importing python3-kubernetes takes most of a second. Each request loads its
kubeconfig afresh. Actions:

    create NAME POOL NONCE      a SandboxClaim in sandkit's shape
    get NAME                    the claim, or {"status": 404}
    list LIMIT                  every claim with sandkit's label, following continue
    delete NAME UID             DELETE with propagationPolicy Background and a uid precondition
    watch NAME RV SECONDS       the watch's events until the claim is Ready=True or it ends
"""
import json
import sys
import traceback

from kubernetes import client, config, watch

GROUP, VERSION, PLURAL = "extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims"
LABEL = "app.kubernetes.io/managed-by"


def failure(e):
    body = None
    try:
        body = json.loads(e.body)
    except (TypeError, ValueError):
        pass
    return {"status": e.status, "reason": e.reason, "body": body}


def ready(obj):
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status"), c.get("reason")
    return None, None


def answer(kubeconfig, action, args):
    contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    namespace = current["context"]["namespace"]
    config.load_kube_config(config_file=kubeconfig)
    api = client.CustomObjectsApi()
    try:
        if action == "create":
            name, pool, nonce = args
            body = {"apiVersion": GROUP + "/" + VERSION, "kind": "SandboxClaim",
                    "metadata": {"name": name, "labels": {LABEL: "sandkit"},
                                 "annotations": {"sandkit.dev/nonce": nonce}},
                    "spec": {"warmPoolRef": {"name": pool}}}
            out = api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        elif action == "get":
            out = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, args[0])
        elif action == "list":
            names, pages, cont = [], 0, None
            while True:
                kwargs = {"label_selector": LABEL + "=sandkit", "limit": int(args[0])}
                if cont:
                    kwargs["_continue"] = cont
                page = api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, **kwargs)
                pages += 1
                names += [item["metadata"]["name"] for item in page["items"]]
                cont = page["metadata"].get("continue")
                if not cont:
                    break
            out = {"names": sorted(names), "pages": pages}
        elif action == "delete":
            name, uid = args
            options = client.V1DeleteOptions(propagation_policy="Background",
                                             preconditions=client.V1Preconditions(uid=uid))
            out = api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                      body=options)
        elif action == "watch":
            name, rv, seconds = args
            events = []
            w = watch.Watch()
            for event in w.stream(api.list_namespaced_custom_object, GROUP, VERSION, namespace,
                                  PLURAL, field_selector="metadata.name=" + name,
                                  resource_version=rv, timeout_seconds=int(seconds),
                                  allow_watch_bookmarks=True):
                obj = event["raw_object"]
                status, reason = ready(obj)
                events.append({"type": event["type"], "ready": status, "reason": reason,
                               "rv": obj["metadata"].get("resourceVersion")})
                if status == "True":
                    w.stop()
            out = {"events": events}
        else:
            raise ValueError("unknown action " + action)
    except client.rest.ApiException as e:
        out = failure(e)
    return out


def main():
    with open(sys.argv[1], "a") as answers:
        for line in sys.stdin:
            request = json.loads(line)
            try:
                out = answer(request[0], request[1], request[2:])
            except Exception:
                # The spec fails with this text instead of waiting for an answer that never comes.
                out = {"referee_failed": traceback.format_exc()}
            answers.write(json.dumps(out, sort_keys=True) + "\n")
            answers.flush()


main()
