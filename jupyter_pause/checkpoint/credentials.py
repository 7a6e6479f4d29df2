"""Which credentials an object store URL will be opened with, in words (for ``doctor``).

Nothing is configured by this project: gcsfs and s3fs follow their ecosystem's own chain, and
this module only names the link of that chain that applies here. It reads environment variables
and well-known files; the only network access is botocore's (the S3 chain may ask the instance
metadata service, with its own short timeouts) and none for GCS unless ``probe=True``.
"""

from __future__ import annotations

import json
import os
from typing import Any


def describe_credentials(url: str, storage_options: dict[str, Any] | None = None, *,
                         probe: bool = False) -> str:
    """One line: the credential source ``url`` will use. Local paths need none."""
    opts = storage_options or {}
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    if scheme in ("gs", "gcs"):
        return _gcs(opts, probe)
    if scheme in ("s3", "s3a"):
        return _s3(opts)
    if scheme in ("file", "local"):
        return "local directory: no credentials (file permissions)"
    return f"{scheme}://: the fsspec implementation's own configuration"


def _gcs(opts: dict[str, Any], probe: bool) -> str:
    token = opts.get("token")
    emulator = opts.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")
    if token == "anon":
        return f"GCS: anonymous (token='anon'){_at(emulator)}"
    if isinstance(token, str) and token not in ("google_default", "cloud", "cache", "browser"):
        return f"GCS: the token or key file given in storage_options ({_file_kind(token)}){_at(emulator)}"
    if token is not None and not isinstance(token, str):
        return f"GCS: credentials object given in storage_options{_at(emulator)}"
    # google.auth.default()'s order (what gcsfs uses for token=None / "google_default")
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if path:
        return (f"GCS: application-default credentials from GOOGLE_APPLICATION_CREDENTIALS="
                f"{path} ({_file_kind(path)}){_at(emulator)}")
    cfg = os.environ.get("CLOUDSDK_CONFIG") or os.path.join(
        os.path.expanduser("~"), ".config", "gcloud")
    adc = os.path.join(cfg, "application_default_credentials.json")
    if os.path.isfile(adc):
        return (f"GCS: application-default credentials from `gcloud auth application-default "
                f"login` ({adc}, {_file_kind(adc)}){_at(emulator)}")
    where = ("the GKE metadata server: Workload Identity (the pod's Kubernetes service account "
             "mapped to a Google service account), else the node's service account")
    if probe:
        try:
            import google.auth

            creds, project = google.auth.default()
            who = getattr(creds, "service_account_email", None) or type(creds).__name__
            return f"GCS: {where}; resolved to {who} (project {project}){_at(emulator)}"
        except Exception as e:  # noqa: BLE001 - reported, not raised
            return f"GCS: no application-default credentials found ({e}){_at(emulator)}"
    return f"GCS: {where} (no key file or gcloud login found; not probed){_at(emulator)}"


def _s3(opts: dict[str, Any]) -> str:
    client = opts.get("client_kwargs") or {}
    endpoint = opts.get("endpoint_url") or client.get("endpoint_url") or os.environ.get(
        "AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if opts.get("anon"):
        return f"S3: anonymous (anon=True){_at(endpoint)}"
    if opts.get("key") or opts.get("secret"):
        return f"S3: access key given in storage_options{_at(endpoint)}"
    if opts.get("profile"):
        return f"S3: profile {opts['profile']!r} from the shared config files{_at(endpoint)}"
    try:
        import botocore.session
    except ImportError:
        return "S3: botocore is not installed (pip install s3fs)"
    creds = botocore.session.get_session().get_credentials()
    if creds is None:
        return f"S3: no credentials found in the default AWS chain{_at(endpoint)}"
    method = getattr(creds, "method", "") or "unknown"
    names = {
        "env": "environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
        "shared-credentials-file": "the shared credentials file (~/.aws/credentials)",
        "config-file": "the shared config file (~/.aws/config)",
        "assume-role": "an assumed role from the shared config",
        "assume-role-with-web-identity":
            "web identity (IRSA / EKS Pod Identity token: AWS_WEB_IDENTITY_TOKEN_FILE)",
        "sso": "AWS IAM Identity Center (SSO)",
        "container-role": "the container credentials endpoint (ECS task role / EKS Pod Identity)",
        "iam-role": "the instance metadata service (EC2 instance profile)",
        "custom-process": "a credential_process from the shared config",
    }
    return f"S3: default AWS chain: {names.get(method, method)}{_at(endpoint)}"


def _at(endpoint: str | None) -> str:
    return f", endpoint {endpoint}" if endpoint else ""


def _file_kind(path: str) -> str:
    try:
        with open(path) as f:
            kind = str(json.load(f).get("type", "unknown type"))
    except (OSError, ValueError, AttributeError):
        return "unreadable"
    return {"service_account": "service account key",
            "authorized_user": "user credentials",
            "external_account": "workload identity federation",
            "impersonated_service_account": "impersonated service account"}.get(kind, kind)
