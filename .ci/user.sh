# The unprivileged user .ci/run runs the test suite as, when it is started as root. Sourced by .ci/run.
CI_USER=posfair-ci
OPENED=()

# Lend the checkout to USER for this run: create the user if missing, give it the checkout (its .venv stays
# root's, readable by all), and make every folder above the checkout and above each PATH traversable for it
# (o+x where it lacks: mktemp -d folders and /root, which holds pyenv's Python behind .venv, are 0700).
# release_checkout undoes it all.
lend_checkout_to() {
  local user=$1 path dir ancestors
  shift
  id -u "$user" >/dev/null 2>&1 || useradd --create-home --user-group --shell /bin/bash "$user"
  LENT_DIR=$PWD
  LENT_OWNER=$(stat -c %u:%g "$LENT_DIR")
  owned_by "$user:" "$LENT_DIR"
  for path in "$LENT_DIR" "$@"; do
    path=$(readlink -f "$path")
    [ -d "$path" ] || path=$(dirname "$path")
    ancestors=()
    while [ "$path" != / ]; do ancestors=("$path" "${ancestors[@]+"${ancestors[@]}"}"); path=$(dirname "$path"); done
    for dir in "${ancestors[@]}"; do  # from the top down, so each check sees its parents already open
      if ! runuser -u "$user" -- test -x "$dir"; then
        chmod o+x "$dir"
        OPENED+=("$dir")
      fi
    done
  done
  echo "tests run as $user (folders opened for it: ${OPENED[*]:-none})"
}

release_checkout() {
  local dir
  for dir in ${OPENED[@]+"${OPENED[@]}"}; do chmod o-x "$dir" || true; done
  OPENED=()
  if [ -n "${LENT_OWNER:-}" ]; then owned_by "$LENT_OWNER" "$LENT_DIR" || true; fi
  LENT_OWNER=
}

# chown -R of a checkout, except its .venv: the tests only read the venv (60,000 files: 6 s a chown here).
owned_by() {
  find "$2" -path "$2/.venv" -prune -o -exec chown "$1" {} +
}
