"""Points the LeaderWorkerSet webhook configurations at the controller on loopback.

stdin: the upstream manifests as kubectl prints them (`create --dry-run=client -o json`); argv: the webhook
server's base URL and the CA file that signed its certificate. Each webhook's clientConfig.service becomes
url + caBundle, and the pod webhooks get the objectSelector LWS's kustomize patch adds, so only LWS pods
pass through them (failurePolicy Fail: any other pod would fail to be created while the controller is down).
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

LWS_POD_SELECTOR = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}


def json_objects(text: str) -> list[dict[str, Any]]:
    """kubectl prints one JSON object per YAML document, one after another (not a List)."""
    decoder, at = json.JSONDecoder(), 0
    objects: list[dict[str, Any]] = []
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return objects
        found, at = decoder.raw_decode(text, at)
        objects += found["items"] if found.get("kind") == "List" else [found]


def on_loopback(items: list[dict[str, Any]], base_url: str, ca_pem: bytes) -> dict[str, Any]:
    ca_bundle = base64.b64encode(ca_pem).decode()
    for item in items:
        for hook in item.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url.rstrip("/") + path, "caBundle": ca_bundle}
            if any("pods" in (rule.get("resources") or []) for rule in hook.get("rules") or []):
                hook["objectSelector"] = LWS_POD_SELECTOR
    return {"apiVersion": "v1", "kind": "List", "items": items}


if __name__ == "__main__":
    base, ca_file = sys.argv[1], sys.argv[2]
    json.dump(on_loopback(json_objects(sys.stdin.read()), base, Path(ca_file).read_bytes()), sys.stdout)
