"""TLS and mutual TLS of the real `ditto serve` binary, with independent clients: Python grpcio
with SSL channel credentials, and urllib with an `ssl` context.

Each test generates its own CA, server certificate (for 127.0.0.1 and localhost) and client
certificates with Python `cryptography`, and hands the files to the server through the
environment names the Helm chart uses (DITTO_TLS_CERT_FILE, DITTO_TLS_KEY_FILE,
DITTO_TLS_CLIENT_CA_FILE).
"""

import base64
import datetime
import http.client
import ipaddress
import os
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conftest import BINARY, Server
from ditto.v1 import twin_pb2 as pb
from ditto.v1 import twin_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key):
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Authority:
    """A CA that signs server and client certificates."""

    def __init__(self, common_name):
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.name = _name(common_name)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    def pem(self):
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name, server):
        """A leaf certificate and its key (PEM): for 127.0.0.1/localhost when `server`."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        else:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


@pytest.fixture
def pki():
    """Files of a CA, a server certificate, a client certificate it signed, and a client
    certificate a foreign CA signed."""
    with tempfile.TemporaryDirectory(prefix="ditto-tls-") as directory:
        ca = Authority("ditto test CA")
        foreign = Authority("someone else's CA")
        files = {"dir": directory, "ca_pem": ca.pem()}

        def write(name, data):
            path = os.path.join(directory, name)
            with open(path, "wb") as handle:
                handle.write(data)
            files[name] = path
            return data

        write("ca.crt", ca.pem())
        cert, key = ca.issue("ditto", server=True)
        write("tls.crt", cert)
        write("tls.key", key)
        files["client"] = ca.issue("epp", server=False)
        files["foreign_client"] = foreign.issue("intruder", server=False)
        yield files


def start(env_extra):
    env = dict(os.environ)
    for name in ("DITTO_TLS_CERT_FILE", "DITTO_TLS_KEY_FILE", "DITTO_TLS_CLIENT_CA_FILE"):
        env.pop(name, None)
    env.update(env_extra)
    return Server(env=env)


def secure(server, credentials):
    """Points the server's channel and stubs at a TLS channel with `credentials`."""
    server.channel.close()
    options = [
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 200),
    ]
    server.channel = grpc.secure_channel(f"127.0.0.1:{server.grpc_port}", credentials, options=options)
    server.twin = twin_pb2_grpc.TwinStub(server.channel)
    server.health = health_pb2_grpc.HealthStub(server.channel)


def stop(server):
    code = server.terminate()
    output = server.output()
    os.unlink(server.log.name)
    assert code == 0, output
    return output


def check_health(channel):
    """The health status over `channel`, or the gRPC error code."""
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return reply.status
    except grpc.RpcError as err:
        return err.code()


def https_get(server, path, context):
    url = f"https://127.0.0.1:{server.http_port}{path}"
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        return response.status, response.read().decode()


def test_grpc_and_http_over_tls_with_a_ca_the_client_trusts(pki):
    server = start({"DITTO_TLS_CERT_FILE": pki["tls.crt"], "DITTO_TLS_KEY_FILE": pki["tls.key"]})
    try:
        secure(server, grpc.ssl_channel_credentials(root_certificates=pki["ca_pem"]))
        server.wait_serving()
        snapshot = server.twin.GetSnapshot(pb.GetSnapshotRequest(now_us=2_000_000), timeout=10)
        assert len(snapshot.instances) > 0
        # A write over TLS is applied.
        before = snapshot.generation
        config = pb.ClusterConfig(
            instances=[
                pb.InstanceSpec(
                    id="ns/vllm-0:8000",
                    address="10.0.0.1:8000",
                    engine=pb.EngineLimits(num_gpu_blocks=4096, max_num_seqs=4, max_model_len=4096),
                )
            ]
        )
        reply = server.twin.SyncClusterConfig(config, timeout=10)
        assert reply.generation > before

        # A plaintext client gets no service.
        plain = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        assert check_health(plain) == grpc.StatusCode.UNAVAILABLE
        plain.close()
        # Nor does a client that does not trust the server's CA.
        untrusting = grpc.secure_channel(
            f"127.0.0.1:{server.grpc_port}",
            grpc.ssl_channel_credentials(root_certificates=Authority("other").pem()),
        )
        assert check_health(untrusting) == grpc.StatusCode.UNAVAILABLE
        untrusting.close()

        # HTTP: HTTPS with the CA; /metrics and the probes answer.
        context = ssl.create_default_context(cafile=pki["ca.crt"])
        status, body = https_get(server, "/metrics", context)
        assert status == 200 and "ditto_" in body
        assert https_get(server, "/readyz", context)[0] == 200
        # Plain HTTP to the TLS port fails (a TLS alert, or a closed connection) rather than
        # answering in clear.
        with pytest.raises((urllib.error.URLError, OSError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10).read()
        # A client without the CA refuses the server's certificate.
        with pytest.raises(urllib.error.URLError) as refused:
            https_get(server, "/metrics", ssl.create_default_context())
        assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    finally:
        output = stop(server)
    assert 'transport="TLS"' in output, output


def test_mutual_tls_requires_a_client_certificate_from_the_client_ca_on_grpc(pki):
    server = start(
        {
            "DITTO_TLS_CERT_FILE": pki["tls.crt"],
            "DITTO_TLS_KEY_FILE": pki["tls.key"],
            "DITTO_TLS_CLIENT_CA_FILE": pki["ca.crt"],
        }
    )
    try:
        cert, key = pki["client"]
        secure(
            server,
            grpc.ssl_channel_credentials(root_certificates=pki["ca_pem"], private_key=key, certificate_chain=cert),
        )
        server.wait_serving()
        snapshot = server.twin.GetSnapshot(pb.GetSnapshotRequest(now_us=2_000_000), timeout=10)
        assert len(snapshot.instances) > 0

        target = f"127.0.0.1:{server.grpc_port}"
        # No client certificate: refused in the handshake.
        anonymous = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=pki["ca_pem"]))
        assert check_health(anonymous) == grpc.StatusCode.UNAVAILABLE
        anonymous.close()
        # A client certificate from another CA: refused too.
        foreign_cert, foreign_key = pki["foreign_client"]
        foreign = grpc.secure_channel(
            target,
            grpc.ssl_channel_credentials(
                root_certificates=pki["ca_pem"], private_key=foreign_key, certificate_chain=foreign_cert
            ),
        )
        assert check_health(foreign) == grpc.StatusCode.UNAVAILABLE
        foreign.close()

        # HTTP verifies a certificate when offered but does not require one: the kubelet's
        # probes carry none.
        context = ssl.create_default_context(cafile=pki["ca.crt"])
        assert https_get(server, "/readyz", context)[0] == 200
    finally:
        stop(server)


def run_serve(args, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.run(
        [BINARY, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_bad_tls_files_fail_at_startup_naming_the_file(pki):
    # A key that does not belong to the certificate.
    other_key = os.path.join(pki["dir"], "other.key")
    _, key = Authority("unrelated").issue("x", server=True)
    with open(other_key, "wb") as handle:
        handle.write(key)
    mismatched = run_serve([], {"DITTO_TLS_CERT_FILE": pki["tls.crt"], "DITTO_TLS_KEY_FILE": other_key})
    assert mismatched.returncode == 2, mismatched.stderr
    assert "certificate and key" in mismatched.stderr
    assert other_key in mismatched.stderr and pki["tls.crt"] in mismatched.stderr, mismatched.stderr
    # A file that is missing.
    missing = os.path.join(pki["dir"], "absent.key")
    absent = run_serve([], {"DITTO_TLS_CERT_FILE": pki["tls.crt"], "DITTO_TLS_KEY_FILE": missing})
    assert absent.returncode == 2, absent.stderr
    assert missing in absent.stderr
    # PEM blocks whose bodies are base64 but not DER (rustls: BadEncoding), and bodies that
    # are not base64 at all: each names its file.
    not_der = base64.encodebytes(b"not a DER structure, just bytes" * 4)
    for name, label, body in [
        ("baddercert.crt", b"CERTIFICATE", not_der),
        ("badb64cert.crt", b"CERTIFICATE", b"@@@@ not base64 @@@@\n"),
    ]:
        path = os.path.join(pki["dir"], name)
        with open(path, "wb") as handle:
            handle.write(b"-----BEGIN " + label + b"-----\n" + body + b"-----END " + label + b"-----\n")
        bad = run_serve([], {"DITTO_TLS_CERT_FILE": path, "DITTO_TLS_KEY_FILE": pki["tls.key"]})
        assert bad.returncode == 2, bad.stderr
        assert path in bad.stderr, bad.stderr
    for name, label, body in [
        ("baddernkey.key", b"PRIVATE KEY", not_der),
        ("badb64key.key", b"PRIVATE KEY", b"@@@@ not base64 @@@@\n"),
    ]:
        path = os.path.join(pki["dir"], name)
        with open(path, "wb") as handle:
            handle.write(b"-----BEGIN " + label + b"-----\n" + body + b"-----END " + label + b"-----\n")
        bad = run_serve([], {"DITTO_TLS_CERT_FILE": pki["tls.crt"], "DITTO_TLS_KEY_FILE": path})
        assert bad.returncode == 2, bad.stderr
        assert path in bad.stderr, bad.stderr
    # A client CA whose body is not DER.
    path = os.path.join(pki["dir"], "badca.crt")
    with open(path, "wb") as handle:
        handle.write(b"-----BEGIN CERTIFICATE-----\n" + not_der + b"-----END CERTIFICATE-----\n")
    bad = run_serve(
        [],
        {"DITTO_TLS_CERT_FILE": pki["tls.crt"], "DITTO_TLS_KEY_FILE": pki["tls.key"], "DITTO_TLS_CLIENT_CA_FILE": path},
    )
    assert bad.returncode == 2, bad.stderr
    assert path in bad.stderr, bad.stderr
    # A certificate without its key is a flag error naming the missing flag.
    alone = run_serve(["--tls-cert-file", pki["tls.crt"]], {})
    assert alone.returncode == 2, alone.stderr
    assert "tls-key-file" in alone.stderr


def run_predict(server, *args):
    return subprocess.run(
        [BINARY, "predict", "--addr", f"127.0.0.1:{server.grpc_port}", "--timeout-ms", "60000",
         "--output-tokens", "16", "--replications", "1", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_predict_command_speaks_tls_and_mutual_tls(pki):
    server = start(
        {
            "DITTO_TLS_CERT_FILE": pki["tls.crt"],
            "DITTO_TLS_KEY_FILE": pki["tls.key"],
            "DITTO_TLS_CLIENT_CA_FILE": pki["ca.crt"],
        }
    )
    try:
        cert, key = pki["client"]
        cert_path = os.path.join(pki["dir"], "client.crt")
        key_path = os.path.join(pki["dir"], "client.key")
        with open(cert_path, "wb") as handle:
            handle.write(cert)
        with open(key_path, "wb") as handle:
            handle.write(key)
        secure(
            server,
            grpc.ssl_channel_credentials(root_certificates=pki["ca_pem"], private_key=key, certificate_chain=cert),
        )
        server.wait_serving()
        answered = run_predict(
            server, "--tls-ca-file", pki["ca.crt"], "--tls-client-cert-file", cert_path,
            "--tls-client-key-file", key_path,
        )
        assert answered.returncode == 0, answered.stderr
        assert "recommended:" in answered.stdout
        # Without the client certificate the server refuses the handshake.
        refused = run_predict(server, "--tls-ca-file", pki["ca.crt"])
        assert refused.returncode == 1, refused.stderr
        # Plaintext to a TLS server fails rather than hangs.
        plain = run_predict(server)
        assert plain.returncode == 1, plain.stderr
        # An unusable CA file is bad input, naming the file.
        missing = os.path.join(pki["dir"], "absent.crt")
        bad = run_predict(server, "--tls-ca-file", missing)
        assert bad.returncode == 2 and missing in bad.stderr, bad.stderr
        # A certificate without its key is a flag error.
        alone = run_predict(server, "--tls-ca-file", pki["ca.crt"], "--tls-client-cert-file", cert_path)
        assert alone.returncode == 2, alone.stderr
    finally:
        stop(server)
