#!/usr/bin/env bash
# LiteLLM's proxy for the side-by-side benchmark (tests/bench/perf): `litellm[proxy]`, pinned with
# its whole dependency closure, in a venv.
#
# Cache: ${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}/venv-litellm (rebuilt when LOCK changes).
# Prints the venv's `litellm` executable as the last line on stdout; logs go to stderr.
# Idempotent, safe to run concurrently (flock), instant when cached.
# Run it offline (as switchyard-perf does) with LITELLM_LOCAL_MODEL_COST_MAP=True and the other
# LITELLM_LOCAL_* switches, so it fetches nothing at start-up.
# Env: SWITCHYARD_CACHE, PYTHON (a python3 >= 3.10 to build the venv from).
set -euo pipefail

CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
VENV="$CACHE/venv-litellm"
PYTHON="${PYTHON:-python3}"

# litellm[proxy]==1.106.12 and its full closure (pip freeze of a working install; the newest
# releases need a litellm-proxy package not published on PyPI). Changing this text rebuilds the venv.
LOCK='aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
APScheduler==3.11.3
attrs==26.1.0
azure-core==1.41.0
azure-identity==1.27.0
azure-storage-blob==12.31.1
backoff==2.2.1
boto3==1.44.8
botocore==1.44.8
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
click==8.5.1
croniter==7.0.0
cryptography==50.0.2
distro==1.9.0
dnspython==2.9.2
email-validator==2.4.0
Expression==5.8.0
fastapi==0.165.0
fastapi-sso==0.23.0
fastuuid==0.14.0
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
granian==2.8.9
gunicorn==23.0.0
h11==0.16.0
h2==4.4.1
hf-xet==1.8.0
hiredis==3.5.0
hpack==4.2.0
httpcore==1.0.9
httpcore2==2.16.2
httpx==0.28.1
httpx2==2.16.2
huggingface_hub==1.33.0
hyperframe==6.1.0
idna==3.20
importlib_metadata==8.9.0
inquirerpy==0.3.4
isodate==0.7.2
Jinja2==3.1.6
jiter==0.19.0
jmespath==1.1.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
litellm==1.106.12
litellm-enterprise==0.1.76.post1
litellm-proxy-extras==0.4.108
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mcp==2.3.0
mcp-types==2.3.0
mdurl==0.1.2
msal==1.39.0
msal-extensions==1.3.1
multidict==7.2.1
numpy==2.4.6
oauthlib==4.0.1
openai==2.54.0
opentelemetry-api==1.45.2
orjson==3.13.0
packaging==26.4
pfzy==0.3.4
polars==1.44.2
polars-runtime-32==1.44.2
prompt_toolkit==3.0.53
propcache==0.5.4
psycopg==3.3.9
psycopg-binary==3.3.9
pycparser==3.12
pydantic==2.14.4
pydantic-settings==2.16.3
pydantic_core==2.50.5
Pygments==2.21.0
PyJWT==2.15.1
PyNaCl==1.6.2
pyroscope-io==0.8.16
python-dateutil==2.9.0.post0
python-dotenv==1.2.4
python-multipart==0.0.34
PyYAML==6.0.4
redis==8.1.0
referencing==0.37.0
regex==2026.11.19
requests==2.34.2
RestrictedPython==8.5
rich==13.9.4
rpds-py==2026.9.1
rq==2.12.0
s3transfer==0.19.3
six==1.17.0
sniffio==1.3.1
soundfile==0.14.0
sse-starlette==3.7.0
starlette==1.10.0
tiktoken==0.14.0
tokenizers==0.23.3
tomlkit==0.15.2
tqdm==4.70.1
truststore==0.10.5
typing-inspection==0.4.5
typing_extensions==4.16.0
tzlocal==5.4.5
urllib3==2.8.0
uvicorn==0.54.0
uvloop==0.23.0
wcwidth==0.9.4
websockets==15.0.1
yarl==1.25.1
zipp==4.1.2'

log() { printf '[litellm.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

LOCK_SHA=$(printf '%s\n' "$LOCK" | sha256sum | cut -d' ' -f1)
venv_ok() { [[ -x "$VENV/bin/litellm" && "$(cat "$VENV/.switchyard-lock" 2>/dev/null)" == "$LOCK_SHA" ]]; }

if venv_ok; then
    log "cached: $VENV"
    echo "$VENV/bin/litellm"
    exit 0
fi

mkdir -p "$CACHE/locks"
exec 9>"$CACHE/locks/litellm.lock"
if ! flock -n 9; then
    log "another run holds $CACHE/locks/litellm.lock; waiting"
    flock 9
fi

if ! venv_ok; then
    command -v "$PYTHON" >/dev/null || die "no $PYTHON (apt-get install python3)"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
        die "$PYTHON is $("$PYTHON" -V 2>&1); litellm 1.106 needs Python >= 3.10"
    if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        [[ $(id -u) -eq 0 ]] || die "$PYTHON has no venv module; as root: apt-get install python3-venv"
        pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        log "apt-get install python$pyver-venv"
        apt-get update -qq </dev/null >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "python$pyver-venv" </dev/null >&2
    fi
    t0=$SECONDS
    rm -rf "$VENV"
    log "creating venv $VENV with $("$PYTHON" -V 2>&1)"
    "$PYTHON" -m venv "$VENV" >&2
    printf '%s\n' "$LOCK" >"$VENV/requirements.lock"
    log "pip install -r $VENV/requirements.lock (litellm[proxy]==1.106.12, ...)"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-input \
        -r "$VENV/requirements.lock" </dev/null >&2
    LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/python" -c 'import litellm.proxy.proxy_server' >&2 ||
        die "the LiteLLM venv does not import litellm.proxy"
    printf '%s\n' "$LOCK_SHA" >"$VENV/.switchyard-lock"
    log "venv ready in $((SECONDS - t0)) s"
fi

echo "$VENV/bin/litellm"
