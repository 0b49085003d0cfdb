# Services for the concurrency and fault tests: PostgreSQL (Debian's package) on loopback and an MLflow tracking
# server backed by it. Sourced by .ci/run; exports POSFAIR_TEST_POSTGRES and POSFAIR_TEST_MLFLOW.
PG_PORT=54329
MLFLOW_PORT=55001

# PostgreSQL needs no venv: .ci/run starts it (installing it first where it is missing) beside `make setup`.
# Its exports are made here, in the calling shell; only the work runs in the background.
start_postgres_in_background() {
  SERVICES_DIR=$(mktemp -d /tmp/posfair-services.XXXXXX)
  chmod 755 "$SERVICES_DIR"
  (
    if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
    pg_bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)")
    mkdir "$SERVICES_DIR/pg" && chown postgres: "$SERVICES_DIR/pg"
    runuser -u postgres -- "$pg_bin/initdb" -D "$SERVICES_DIR/pg" -A trust -U posfair >/dev/null
    runuser -u postgres -- "$pg_bin/pg_ctl" -D "$SERVICES_DIR/pg" -l "$SERVICES_DIR/pg/server.log" -w \
      -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $SERVICES_DIR/pg" start >/dev/null
    for db in optuna mlflow; do
      runuser -u postgres -- "$pg_bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U posfair "$db"
    done
  ) &
  POSTGRES_STARTER=$!
  export POSFAIR_TEST_POSTGRES="postgresql://posfair@127.0.0.1:$PG_PORT/optuna"
}

# The MLflow server, backed by PostgreSQL: after `make setup` (it runs from the venv) and PostgreSQL's start.
start_mlflow() {
  wait "$POSTGRES_STARTER" || { echo "PostgreSQL did not start"; return 1; }
  # Without MLflow's job runner, as `tune ui` serves (tuner.tracking.runs.ui_environment): eight processes fewer.
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false .venv/bin/mlflow server \
    --backend-store-uri "postgresql://posfair@127.0.0.1:$PG_PORT/mlflow" \
    --artifacts-destination "$SERVICES_DIR/artifacts" --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 \
    >"$SERVICES_DIR/mlflow.log" 2>&1 &
  MLFLOW_PID=$!
  for _ in $(seq 1 120); do
    mlflow_healthy && break
    sleep 1
  done
  mlflow_healthy || { cat "$SERVICES_DIR/mlflow.log"; return 1; }
  export POSFAIR_TEST_MLFLOW="http://127.0.0.1:$MLFLOW_PORT"
  echo "services: PostgreSQL on 127.0.0.1:$PG_PORT, MLflow on $POSFAIR_TEST_MLFLOW"
}

# Both, one after the other (for a local run of the suite with the services: `make setup` first).
start_services() {
  start_postgres_in_background
  make setup >/dev/null
  start_mlflow
}

mlflow_healthy() {
  local url="http://127.0.0.1:$MLFLOW_PORT/health"
  .venv/bin/python -c "import urllib.request; urllib.request.urlopen('$url', timeout=2)" 2>/dev/null
}

stop_services() {
  [ -n "${MLFLOW_PID:-}" ] && kill "$MLFLOW_PID" 2>/dev/null || true
  if [ -n "${SERVICES_DIR:-}" ] && [ -d "$SERVICES_DIR/pg" ]; then
    runuser -u postgres -- "$(dirname "$(ls /usr/lib/postgresql/*/bin/pg_ctl | sort -V | tail -n 1)")/pg_ctl" \
      -D "$SERVICES_DIR/pg" -m fast stop >/dev/null 2>&1 || true
  fi
}
