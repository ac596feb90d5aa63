//! End to end: JWTs signed with public-key algorithms (RS256, ES256),
//! verified by the gateway through OpenSSL (gateway/REFERENCE.md,
//! `identity.jwt`). Keys and signatures come from the `openssl` command;
//! real nginx, Redis with the module, real HTTP.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::{fresh_dir, Server};
use gateway::{agent, get};
use gateway_policy::{start, Front};

/// Runs `openssl args`, with `input` on stdin; its stdout.
fn openssl(args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write");
    let out = child.wait_with_output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}");
    out.stdout
}

/// A new private key (`kind`: `rsa` or `ec`) in `dir`; returns its path
/// and its public key (PEM).
fn keypair(dir: &Path, name: &str, kind: &str) -> (String, String) {
    let key = dir.join(format!("{name}.key")).display().to_string();
    let args: Vec<&str> = match kind {
        "rsa" => vec![
            "genpkey",
            "-quiet",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            &key,
        ],
        _ => vec![
            "genpkey",
            "-quiet",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            &key,
        ],
    };
    openssl(&args, b"");
    let public = openssl(&["pkey", "-in", &key, "-pubout"], b"");
    (key, String::from_utf8(public).expect("PEM"))
}

/// The JWS form of an ECDSA signature: DER `SEQUENCE { INTEGER r,
/// INTEGER s }` to r || s, 32 bytes each.
fn ecdsa_raw(der: &[u8]) -> Vec<u8> {
    let mut out = vec![];
    let mut at = 2; // SEQUENCE tag and a short length (P-256 signatures are < 128 bytes)
    for _ in 0..2 {
        assert_eq!(der[at], 0x02, "INTEGER");
        let len = der[at + 1] as usize;
        let int = &der[at + 2..at + 2 + len];
        let int = &int[int.len().saturating_sub(32)..];
        out.extend(std::iter::repeat_n(0, 32 - int.len()));
        out.extend_from_slice(int);
        at += 2 + len;
    }
    out
}

/// A JWT with header `alg` and `claims`, signed with the private key at
/// `key` (an `ES256` signature in the JWS form).
fn token(alg: &str, claims: &str, key: &str) -> String {
    let head = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#));
    let body = URL_SAFE_NO_PAD.encode(claims);
    let signed = format!("{head}.{body}");
    let mut sig = openssl(&["dgst", "-sha256", "-sign", key], signed.as_bytes());
    if alg == "ES256" {
        sig = ecdsa_raw(&sig);
    }
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig))
}

fn policy(alg: &str, key_file: &str) -> String {
    format!(
        r#"return {{
    redis = {{ port = tonumber(os.getenv("RL_REDIS_PORT")), timeout_ms = 1000 }},
    key_prefix = "{alg}",
    identity = {{ required = true,
                 jwt = {{ alg = "{alg}", public_key_file = DIR .. "/{key_file}" }} }},
    rules = {{ {{ name = "per-user", scope = {{ "user" }},
                limiter = {{ kind = "window", mode = "exact", limit = 2, window = 60 }} }} }},
}}"#
    )
}

#[test]
fn rs256_and_es256_tokens_are_verified_with_the_public_key() {
    let redis = Server::start(&[]);
    let keys = fresh_dir("jwt-keys");
    let (rsa, rsa_pub) = keypair(&keys, "rsa", "rsa");
    let (other_rsa, _) = keypair(&keys, "other", "rsa");
    let (ec, ec_pub) = keypair(&keys, "ec", "ec");
    let fronts = [
        Front::Nginx("dofile(DIR .. \"/rs.lua\")".into()),
        Front::Nginx("dofile(DIR .. \"/es.lua\")".into()),
    ];
    let gw = start(
        redis.port,
        &fronts,
        &[
            ("rs.lua", &policy("RS256", "rsa.pub")),
            ("es.lua", &policy("ES256", "ec.pub")),
            ("rsa.pub", &rsa_pub),
            ("ec.pub", &ec_pub),
        ],
    )
    .expect("start");
    let a = agent();
    let exp = r#""exp":4102444800"#; // 2100-01-01
    let status = |front: usize, t: &str| {
        let auth = format!("Bearer {t}");
        get(
            &a,
            &format!("{}/v1/x", gw.url(front)),
            &[("Authorization", &auth)],
        )
        .status
    };
    for (front, alg, key) in [(0, "RS256", &rsa), (1, "ES256", &ec)] {
        let good = token(alg, &format!(r#"{{"sub":"u1",{exp}}}"#), key);
        // the claims key the rule: 2 a minute for u1
        assert_eq!(
            [
                status(front, &good),
                status(front, &good),
                status(front, &good)
            ],
            [200, 200, 429],
            "{alg}"
        );
        let other = token(alg, &format!(r#"{{"sub":"u2",{exp}}}"#), key);
        assert_eq!(status(front, &other), 200, "{alg}: another user");
        // a payload changed after signing
        let (signed, sig) = other.rsplit_once('.').expect("token");
        let (head, _) = signed.split_once('.').expect("token");
        let forged_body = URL_SAFE_NO_PAD.encode(format!(r#"{{"sub":"u3",{exp}}}"#));
        assert_eq!(
            status(front, &format!("{head}.{forged_body}.{sig}")),
            401,
            "{alg}: tampered"
        );
        // an expired token
        let old = token(alg, r#"{"sub":"u4","exp":1000000000}"#, key);
        assert_eq!(status(front, &old), 401, "{alg}: expired");
    }
    // another RSA key, an ES256 token on the RS256 front end, and HS256
    // signed with the public key as the secret (alg confusion): refused
    let claims = format!(r#"{{"sub":"u5",{exp}}}"#);
    assert_eq!(status(0, &token("RS256", &claims, &other_rsa)), 401);
    assert_eq!(status(0, &token("ES256", &claims, &ec)), 401);
    let hs = gateway_policy::jwt(serde_json::json!({"sub": "u5"}), &rsa_pub);
    assert_eq!(status(0, &hs), 401);
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );

    // a key file that is not a public key stops nginx with the field named
    let err = match start(
        redis.port,
        &fronts[..1],
        &[
            ("rs.lua", &policy("RS256", "rsa.pub")),
            ("rsa.pub", "garbage"),
        ],
    ) {
        Ok(_) => panic!("nginx started with a bad key"),
        Err(e) => e,
    };
    assert!(
        err.contains("identity.jwt: the public key: not a PEM public key"),
        "{err}"
    );
}
