# shellcheck shell=bash disable=SC2034
# Shared settings and helpers for localstack/{install,up,down,env}. Sourced, not run.

LOCALSTACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_DIR="$LOCALSTACK_DIR/.cache"
RUN_DIR="$LOCALSTACK_DIR/.run"

# Pinned emulators. The integrity strings are the registry's sha512 of each
# tarball; install checks them itself on top of npm's own check, so a changed
# upstream tarball fails loudly instead of being used.
KINESIS_PKG=kinesis-local
KINESIS_VERSION=0.6.2
KINESIS_INTEGRITY='sha512-mFlmksPMQP/A3nT22N2E8WzUbJcbEdxkCnhNCx2lHj20CW4vzuVH8zn5ByRg5LS5es8tvnx2mY1DpbZ5kw9PPQ=='
# DynamoDB Local ships inside this package's emulator/ folder (DynamoDB Local 1.25.1).
DYNAMODB_PKG=amplify-dynamodb-simulator
DYNAMODB_VERSION=2.9.30
DYNAMODB_INTEGRITY='sha512-xTeeRLvzEfqyd5lh3bH4c0kHvSHHmmhD5ZDsHFKAQ5g2Zl6JqlFdutaQhCLHzxEp6Ry1o7TB6niIoXuQAnSewQ=='

# The real Java KCL 3.x, for the tests of a fleet mixing it with kcl: its jars
# ship inside this PyPI wheel (amazon_kclpy/jars/). The checksum is PyPI's
# sha256 of the wheel.
JAVA_KCL_PKG=kclpy-ext
JAVA_KCL_VERSION=3.1.3.post4
JAVA_KCL_SHA256=6c8ced93674bd30103b9bdc319702e3637d2833641bbe58dda578f8a418858c2

# moto's server, for the test of the CloudWatch publisher
# (tests/tests/observability/cloudwatch.rs), in a virtualenv of its own.
MOTO_VERSION=5.2.5
MOTO_DIR="$CACHE_DIR/moto-$MOTO_VERSION"

KINESIS_DIR="$CACHE_DIR/$KINESIS_PKG-$KINESIS_VERSION"
DYNAMODB_DIR="$CACHE_DIR/$DYNAMODB_PKG-$DYNAMODB_VERSION"
JAVA_KCL_DIR="$CACHE_DIR/$JAVA_KCL_PKG-$JAVA_KCL_VERSION"

KINESIS_PORT="${KCL_KINESIS_PORT:-14568}"
KINESIS_TLS_PORT="${KCL_KINESIS_TLS_PORT:-14567}"
DYNAMODB_PORT="${KCL_DYNAMODB_PORT:-18000}"
BIND_HOST=127.0.0.1
EMULATOR_REGION=us-east-1
STARTUP_TIMEOUT_SECS="${KCL_EMULATOR_STARTUP_TIMEOUT:-60}"

log() { printf 'localstack: %s\n' "$*" >&2; }
die() { printf 'localstack: error: %s\n' "$*" >&2; exit 1; }

need_tool() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed or not on PATH; $2"
}

# Major version of the `java` on PATH (17 for "17.0.15", 8 for "1.8.0_392").
java_major() {
    local v
    v="$(java -version 2>&1 | sed -n 's/.* version "\([^"]*\)".*/\1/p' | head -n1)"
    [[ -n "$v" ]] || { echo 0; return; }
    if [[ "$v" == 1.* ]]; then v="${v#1.}"; fi
    echo "${v%%[!0-9]*}"
}

pid_file() { echo "$RUN_DIR/$1.pid"; }
log_file() { echo "$RUN_DIR/$1.log"; }

# The command line that identifies a process we started, so that a recycled PID
# is never mistaken for (or killed as) one of our emulators.
cmdline_marker() {
    case "$1" in
        kinesis) echo "$KINESIS_DIR/main.js" ;;
        dynamodb) echo "$DYNAMODB_DIR/emulator/DynamoDBLocal.jar" ;;
        *) die "unknown emulator '$1'" ;;
    esac
}

# Prints the PID recorded for emulator $1 if that process is alive and still is
# the emulator this checkout started; returns non-zero otherwise.
running_pid() {
    local name="$1" file pid args
    file="$(pid_file "$name")"
    [[ -f "$file" ]] || return 1
    pid="$(tr -dc '0-9' <"$file")"
    [[ -n "$pid" ]] || return 1
    args="$(ps -o args= -p "$pid" 2>/dev/null)" || return 1
    [[ "$args" == *"$(cmdline_marker "$name")"* ]] || return 1
    echo "$pid"
}

# True while process $1 exists and is not a zombie (whatever its command line:
# right after the fork it is still the shell that is about to exec the emulator).
process_alive() {
    local stat
    stat="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
    [[ -n "$stat" && "$stat" != Z* ]]
}

# Closes every file descriptor above 2 of the current (sub)shell. The emulators
# outlive the command that started them; an inherited pipe (a CI runner's
# output, make's jobserver) held open by them can keep that caller waiting.
close_inherited_fds() {
    local path fd
    for path in /proc/"$BASHPID"/fd/* /dev/fd/*; do
        fd="${path##*/}"
        if [[ ! "$fd" =~ ^[0-9]+$ ]] || ((fd <= 2)); then continue; fi
        eval "exec $fd>&-"
    done
}

# Headers a real SDK request carries. Both emulators reject requests without an
# Authorization header (MissingAuthenticationToken) and kinesis-mock also wants
# X-Amz-Date; neither checks the signature.
fake_sigv4() {
    local service="$1" now
    now="$(date -u +%Y%m%dT%H%M%SZ)"
    printf '%s\n' \
        "Authorization: AWS4-HMAC-SHA256 Credential=test/${now%%T*}/$EMULATOR_REGION/$service/aws4_request, SignedHeaders=host;x-amz-date, Signature=0" \
        "X-Amz-Date: $now"
}

# Makes one real API call against emulator $1 on port $2; succeeds when it answers.
probe() {
    local name="$1" port="$2" target content_type expect service body
    case "$name" in
        kinesis)
            service=kinesis target=Kinesis_20131202.ListStreams
            content_type=application/x-amz-json-1.1 expect='"StreamNames"' ;;
        dynamodb)
            service=dynamodb target=DynamoDB_20120810.ListTables
            content_type=application/x-amz-json-1.0 expect='"TableNames"' ;;
    esac
    local -a headers=(-H "X-Amz-Target: $target" -H "Content-Type: $content_type")
    local h
    while IFS= read -r h; do headers+=(-H "$h"); done < <(fake_sigv4 "$service")
    body="$(curl -sS --fail -m 3 -X POST "${headers[@]}" -d '{}' "http://$BIND_HOST:$port/" 2>/dev/null)" || return 1
    [[ "$body" == *"$expect"* ]]
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_in_use() {
    (exec 3<>"/dev/tcp/$BIND_HOST/$1") 2>/dev/null
}

env_lines() {
    cat <<EOT
export AWS_ENDPOINT_URL_KINESIS=http://$BIND_HOST:$1
export AWS_ENDPOINT_URL_DYNAMODB=http://$BIND_HOST:$2
export AWS_REGION=$EMULATOR_REGION
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export KCL_JAVA_KCL_JARS=$JAVA_KCL_DIR/jars
export KCL_MOTO_SERVER=$MOTO_DIR/bin/moto_server
EOT
}
