//! Real registries behind one registry agent (issue 24 item 4): docker-registry
//! A over HTTPS (a CA of the test's own) with htpasswd Basic auth, and
//! docker-registry B with Bearer-token auth from a token server written here
//! (the Docker token spec: a 401 naming the realm, a GET of the realm with
//! Basic credentials, an ES256 JWT whose `x5c` chains to B's
//! `rootcertbundle`). One `qr registry-agent` has both as upstreams, chosen
//! by the registry a client names (`--upstream HOST=URL`), with
//! `--upstream-ca` and a credential file in Docker's `config.json` format.
//!
//! - containerd (`ctr images pull --hosts-dir`, a hosts.toml mirror per
//!   registry pointing at the node agent, so its requests carry `?ns=HOST`)
//!   pulls an image from each registry through the agents; its content store
//!   holds exactly each registry's blobs, and neither registry saw containerd.
//! - A request naming no registry the agent knows is refused with a message
//!   naming `--upstream`.
//! - `qr pull HOST/REPO:TAG --platform` picks an index's entry by platform,
//!   and names the platforms it has when none matches.
//! - A registry agent with wrong credentials fails with an error naming the
//!   user and the file, for Basic and for Bearer.
//!
//! Addresses: 127.0.111.93 registry A (TCP 19194), .94 registry B (19195)
//! and its token server (19196), .95 registry agent (bootstrap 19197,
//! metrics 19198), .96 node agent (HTTP 19199), .97 a registry agent with
//! wrong credentials (bootstrap 19200), .98 `qr pull`.

mod image_support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use image_support::*;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING};

const A: &str = "127.0.111.93:19194";
const B: &str = "127.0.111.94:19195";
const TOKEN: &str = "127.0.111.94:19196";
const NODE: &str = "127.0.111.96:19199";
const SERVICE: &str = "qr-test-registry";
const ISSUER: &str = "qr-test-issuer";
static PULLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const ALICE: (&str, &str) = ("alice", "wonderland");
const BOB: (&str, &str) = ("bob", "hunter2");

fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The token server: answers `GET /token?service=…&scope=repository:R:A,…`
/// with a JWT granting the requested actions, for `BOB`'s Basic
/// credentials only (401 otherwise). Writes the certificate docker-registry
/// must trust to `ca`. Runs on its own thread until the test process ends.
fn token_server(ca: &Path) {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let key =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let rc_key = rcgen::KeyPair::try_from(pkcs8.as_ref()).unwrap();
    assert_eq!(rc_key.public_key_raw(), key.public_key().as_ref());
    let cert = rcgen::CertificateParams::new(vec!["qr-test-token-signer".into()])
        .unwrap()
        .self_signed(&rc_key)
        .unwrap();
    std::fs::write(ca, cert.pem()).unwrap();
    let x5c = b64(cert.der());
    let listener = TcpListener::bind(TOKEN).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).to_string();
            let (status, body) = answer_token(&head, &key, &rng, &x5c);
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

fn answer_token(head: &str, key: &EcdsaKeyPair, rng: &SystemRandom, x5c: &str) -> (String, String) {
    let target = head.split(' ').nth(1).unwrap_or("");
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let authorized = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("authorization: basic ")
            && base64::engine::general_purpose::STANDARD
                .decode(l[21..].trim())
                .is_ok_and(|c| c == format!("{}:{}", BOB.0, BOB.1).as_bytes())
    });
    if !authorized {
        return (
            "401 Unauthorized".into(),
            r#"{"details":"bad credentials"}"#.into(),
        );
    }
    let mut access = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        // scope = repository:NAME:ACTION[,ACTION]
        if k == "scope" {
            let mut parts = v.splitn(3, ':');
            if let (Some(t), Some(name), Some(actions)) = (parts.next(), parts.next(), parts.next())
            {
                access.push(serde_json::json!({
                    "type": t, "name": name, "actions": actions.split(',').collect::<Vec<_>>()
                }));
            }
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = serde_json::json!({ "typ": "JWT", "alg": "ES256", "x5c": [x5c] });
    let claims = serde_json::json!({
        "iss": ISSUER, "sub": BOB.0, "aud": SERVICE, "exp": now + 600, "nbf": now - 10,
        "iat": now, "jti": format!("{now}-{}", access.len()), "access": access,
    });
    let signing_input = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let sig = key.sign(rng, signing_input.as_bytes()).unwrap();
    let token = format!("{signing_input}.{}", b64url(sig.as_ref()));
    (
        "200 OK".into(),
        serde_json::json!({ "token": token, "expires_in": 600 }).to_string(),
    )
}

/// A credential file in Docker's `config.json` format.
fn auth_file(path: &Path, entries: &[(&str, (&str, &str))]) -> PathBuf {
    let mut auths = serde_json::Map::new();
    for (host, (u, p)) in entries {
        auths.insert(
            host.to_string(),
            serde_json::json!({ "auth": b64(format!("{u}:{p}").as_bytes()) }),
        );
    }
    std::fs::write(path, serde_json::json!({ "auths": auths }).to_string()).unwrap();
    path.to_path_buf()
}

fn skopeo_copy(args: &[&str]) {
    run(Command::new("skopeo").arg("copy").args(args));
}

/// Turn the umoci image tagged `v1` in `layout` into an index tagged
/// `multi` of two platforms: linux/amd64 (the image) and linux/arm64 (the
/// same layers under a config saying arm64). Returns the arm64 manifest's
/// digest.
fn add_multi_arch_index(layout: &Path) -> String {
    let blob = |d: &str| layout.join("blobs/sha256").join(&d[7..]);
    let put = |bytes: &[u8]| -> (String, usize) {
        use sha2::Digest as _;
        let d = format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)));
        std::fs::write(blob(&d), bytes).unwrap();
        (d, bytes.len())
    };
    let read_json = |p: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let mut index = read_json(layout.join("index.json"));
    let entry = index["manifests"][0].clone();
    let amd = entry["digest"].as_str().unwrap().to_string();
    let mut manifest = read_json(blob(&amd));
    let mut config = read_json(blob(manifest["config"]["digest"].as_str().unwrap()));
    config["architecture"] = "arm64".into();
    let (cd, cs) = put(config.to_string().as_bytes());
    manifest["config"]["digest"] = cd.into();
    manifest["config"]["size"] = cs.into();
    let (arm, arm_size) = put(manifest.to_string().as_bytes());
    let mt = "application/vnd.oci.image.manifest.v1+json";
    let image_index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            { "mediaType": mt, "digest": amd, "size": entry["size"],
              "platform": { "os": "linux", "architecture": "amd64" } },
            { "mediaType": mt, "digest": arm, "size": arm_size,
              "platform": { "os": "linux", "architecture": "arm64" } },
        ]
    });
    let (id, is) = put(image_index.to_string().as_bytes());
    index["manifests"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.index.v1+json", "digest": id, "size": is,
            "annotations": { "org.opencontainers.image.ref.name": "multi" }
        }));
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
    arm
}

fn qr_pull(
    d: &Path,
    pki: &Path,
    registry: &str,
    image: &str,
    extra: &[&str],
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_qr"))
        .args([
            "pull",
            image,
            "--registry",
            registry,
            "--ip",
            "127.0.111.98",
            "--json",
        ])
        .args(extra)
        .arg("--cert")
        .arg(pki.join("node.pem"))
        .arg("--key")
        .arg(pki.join("node-key.pem"))
        .arg("--ca")
        .arg(pki.join("ca.pem"))
        .arg("--cache-dir")
        .arg(d.join(format!(
            "pull-cache-{}",
            PULLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )))
        .output()
        .unwrap()
}

fn registry_agent(
    d: &Path,
    pki: &Path,
    ip: &str,
    port: u16,
    auth: &Path,
    upki: &Path,
) -> Vec<String> {
    let mut a = registry_agent_args(
        pki,
        ip,
        port,
        "unused",
        &d.join(format!("rc-{ip}")),
        &format!("{ip}:19198"),
    );
    // Both upstreams named, none by default.
    let at = a.iter().position(|x| x == "--upstream").unwrap();
    a.drain(at..at + 2);
    a.extend(
        [
            "--upstream",
            &format!("{A}=https://{A}"),
            "--upstream",
            &format!("{B}=http://{B}"),
            "--upstream-ca",
            &upki.join("ca.pem").display().to_string(),
            "--upstream-credentials",
            &auth.display().to_string(),
        ]
        .map(String::from),
    );
    a
}

#[test]
fn containerd_pulls_from_two_authenticated_registries_through_one_agent() {
    require(&["docker-registry", "skopeo", "umoci", "containerd", "ctr"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // Registry A: HTTPS with a CA of its own, htpasswd.
    let upki = d.join("upki");
    run(Command::new(env!("CARGO_BIN_EXE_qr"))
        .args(["cert", "--dir"])
        .arg(&upki)
        .args([
            "--leaf",
            &format!("upstream={}", &A[..A.find(':').unwrap()]),
        ]));
    let hash = bcrypt::hash_with_result(ALICE.1, 4)
        .unwrap()
        .format_for_version(bcrypt::Version::TwoA);
    std::fs::write(d.join("htpasswd"), format!("{}:{hash}\n", ALICE.0)).unwrap();
    let reg_a = Registry::start_with(
        &d.join("a"),
        A,
        &format!(
            "  tls:\n    certificate: {}\n    key: {}\n",
            upki.join("upstream.pem").display(),
            upki.join("upstream-key.pem").display()
        ),
        &format!(
            "auth:\n  htpasswd:\n    realm: qr-test\n    path: {}\n",
            d.join("htpasswd").display()
        ),
    );
    // Registry B: Bearer tokens from the token server.
    token_server(&d.join("token-ca.pem"));
    let reg_b = Registry::start_with(
        &d.join("b"),
        B,
        "",
        &format!(
            "auth:\n  token:\n    realm: http://{TOKEN}/token\n    service: {SERVICE}\n    \
             issuer: {ISSUER}\n    rootcertbundle: {}\n",
            d.join("token-ca.pem").display()
        ),
    );

    // An image in each (pushed with the same credentials, as a CI would).
    let layout = build_image(d, "v1", &[6 << 20, 16 << 10]);
    let arm = add_multi_arch_index(&layout);
    let creds = |c: (&str, &str)| format!("{}:{}", c.0, c.1);
    let src = format!("oci:{}:v1", layout.display());
    for (host, c) in [(A, ALICE), (B, BOB)] {
        let dest = format!("docker://{host}/qr/app:v1");
        skopeo_copy(&[
            "--dest-tls-verify=false",
            "--dest-creds",
            &creds(c),
            &src,
            &dest,
        ]);
    }
    let multi = format!("oci:{}:multi", layout.display());
    let dest = format!("docker://{A}/qr/multi:v1");
    skopeo_copy(&[
        "--all",
        "--dest-tls-verify=false",
        "--dest-creds",
        &creds(ALICE),
        &multi,
        &dest,
    ]);

    let pki = pki(d, "127.0.111.95");
    let good = auth_file(
        &d.join("auth.json"),
        &[(A, ALICE), (&format!("http://{B}"), BOB)],
    );
    let _ra = qr(
        "registry-agent",
        &registry_agent(d, &pki, "127.0.111.95", 19197, &good, &upki),
        &d.join("ra.log"),
    );
    let _na = qr(
        "node-agent",
        &node_agent_args(
            &pki,
            "127.0.111.96",
            "127.0.111.95:19197",
            NODE,
            &d.join("nc"),
        ),
        &d.join("na.log"),
    );

    // containerd, one mirror entry per registry, both the node agent.
    let containerd = Containerd::start(d, NODE, &[(A, "https"), (B, "http")]);
    let want = layout_digests_of(&layout, "v1");
    for host in [A, B] {
        containerd.pull(&format!("{host}/qr/app:v1"), &d.join("ra.log"));
    }
    assert_eq!(
        containerd.content(),
        want,
        "the same image from both registries"
    );
    for reg in [&reg_a, &reg_b] {
        let log = std::fs::read_to_string(&reg.log).unwrap();
        assert!(
            !log.contains("useragent=containerd"),
            "containerd reached {} directly",
            reg.addr
        );
        // The agent did reach each, authenticated: the manifest was
        // answered 200 (the blobs, the same in both, may come from the
        // agent's cache the second time).
        assert!(
            log.lines().any(|l| l.contains("msg=\"response completed")
                && l.contains("/v2/qr/app/manifests/v1")
                && l.contains("http.response.status=200")),
            "the agent never got the manifest from {}",
            reg.addr
        );
    }

    // No registry named and no default upstream: refused, saying how to fix it.
    let (st, _, body) = http_get(NODE, "/v2/qr/app/manifests/v1", &[]);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(st, 404, "{text}");
    assert!(text.contains("--upstream"), "{text}");

    // qr pull HOST/REPO:TAG --platform: the index's arm64 entry.
    let image = format!("{A}/qr/multi:v1");
    let out = qr_pull(
        d,
        &pki,
        "127.0.111.95:19197",
        &image,
        &["--platform", "linux/arm64"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["manifest"], arm.as_str(), "{summary}");
    let out = qr_pull(
        d,
        &pki,
        "127.0.111.95:19197",
        &image,
        &["--platform", "linux/s390x"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("linux/amd64, linux/arm64") && err.contains("--platform"),
        "{err}"
    );

    // Wrong credentials: an error naming the user and the flag, for Basic
    // (A) and for the token server (B).
    let bad = auth_file(
        &d.join("bad.json"),
        &[(A, (ALICE.0, "nope")), (B, (BOB.0, "nope"))],
    );
    let _bad_ra = qr(
        "registry-agent (wrong credentials)",
        &registry_agent(d, &pki, "127.0.111.97", 19200, &bad, &upki),
        &d.join("ra-bad.log"),
    );
    for (host, user) in [(A, ALICE.0), (B, BOB.0)] {
        let out = qr_pull(
            d,
            &pki,
            "127.0.111.97:19200",
            &format!("{host}/qr/app:v1"),
            // Its certificate is the other agent's (issued for .95).
            &["--server-name", "127.0.111.95"],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{host}");
        assert!(
            err.contains(&format!("credentials of user `{user}`"))
                && err.contains("--upstream-credentials"),
            "{host}: {err}"
        );
    }
}

/// Every digest of the image tagged `tag` in `layout` (manifest, config,
/// layers), sorted.
fn layout_digests_of(layout: &Path, tag: &str) -> Vec<String> {
    let read = |d: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(&d[7..])).unwrap())
            .unwrap()
    };
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let m = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let manifest = read(&m);
    let mut out = vec![
        m,
        manifest["config"]["digest"].as_str().unwrap().to_string(),
    ];
    out.extend(
        manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string()),
    );
    out.sort();
    out
}
