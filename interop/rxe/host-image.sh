#!/usr/bin/env bash
# Host half of the rxe guest's image step (run-tests.sh, via run.sh --netdev tap
# --host): an OCI image layout with one incompressible blob of SIZE MiB, the dev
# PKI, and `qr registry-agent --provider soft` on 10.77.0.1 serving that layout.
# The guest's half (guest-net.sh image-node) runs `qr node-agent --provider
# verbs` and pulls the blob through its HTTP API; both share $RXE_XFER
# (/tmp/xfer in the guest): pki/, blob.digest, ready (written here), done
# (written by the guest). Exits 0 only if the guest reported success and the
# registry agent sent at least the blob's bytes over the fabric.
# Usage: host-image.sh QR [SIZE_MIB]
set -euo pipefail
QR="$1"; MIB="${2:-64}"
X="$RXE_XFER"
W="$(mktemp -d /tmp/qr-rxe-image.XXXXXX)"
ra=
cleanup() { [[ -n "$ra" ]] && kill "$ra" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
# The QUIC timers of the tap steps (run-tests.sh): the guest runs emulated.
QR_LIVENESS="--idle-timeout 30s --keep-alive 1s"

# image-spec "Image Layout": oci-layout, index.json, blobs/sha256/<hex>.
python3 - "$W/layout" "$MIB" >"$X/blob.digest" <<'PY'
import hashlib, json, os, sys
root, mib = sys.argv[1], int(sys.argv[2])
blobs = os.path.join(root, "blobs", "sha256")
os.makedirs(blobs)
def put(data):
    h = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, h), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + h, "size": len(data)}
layer = put(os.urandom(mib << 20))
config = put(json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode())
manifest = put(json.dumps({"schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": dict(config, mediaType="application/vnd.oci.image.config.v1+json"),
    "layers": [dict(layer, mediaType="application/vnd.oci.image.layer.v1.tar")]}).encode())
index = {"schemaVersion": 2, "manifests": [dict(manifest,
    mediaType="application/vnd.oci.image.manifest.v1+json",
    annotations={"org.opencontainers.image.ref.name": "v1"})]}
open(os.path.join(root, "index.json"), "w").write(json.dumps(index))
open(os.path.join(root, "oci-layout"), "w").write('{"imageLayoutVersion":"1.0.0"}')
print(layer["digest"])
PY
echo "layout with a $MIB MiB blob $(cat "$X/blob.digest")"
"$QR" cert --dir "$X/pki" --leaf registry=10.77.0.1 --leaf node=node >/dev/null

"$QR" registry-agent --provider soft --layout "$W/layout" --layout-repository qr/rxe --ip 10.77.0.1 \
  --service-port 19651 --metrics 10.77.0.1:19652 --cache-dir "$W/cache" \
  --cert "$X/pki/registry.pem" --key "$X/pki/registry-key.pem" --ca "$X/pki/ca.pem" \
  $QR_LIVENESS >"$W/ra.out" 2>"$W/ra.log" &
ra=$!
for _ in $(seq 1 300); do grep -q ready "$W/ra.out" 2>/dev/null && break; kill -0 $ra || break; sleep 0.1; done
grep -q ready "$W/ra.out" || { echo "registry agent did not start:"; cat "$W/ra.log"; exit 1; }
cat "$W/ra.out"
: >"$X/ready"

# The guest boots, pulls and writes its exit code to done (TCG: minutes).
for _ in $(seq 1 900); do [[ -s "$X/done" ]] && break; kill -0 $ra || break; sleep 1; done
[[ -s "$X/done" ]] || { echo "no result from the guest"; tail -20 "$W/ra.log"; exit 1; }
sent=$(curl -fsS http://10.77.0.1:19652/metrics | awk '$1=="qr_registry_sent_bytes_total"{print $2}')
echo "guest exit $(cat "$X/done"); registry agent sent ${sent:-?} blob bytes over the fabric"
[[ "$(cat "$X/done")" == 0 && -n "$sent" && "$sent" -ge $((MIB << 20)) ]]
