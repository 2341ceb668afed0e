#!/usr/bin/env bash
# Kills `attncheck check` in the middle of a call that hangs, by SIGKILL and by SIGTERM, and checks that no
# process it started (plug-in host, exec: client and whatever they started) outlives it.
#   no_orphans.sh ATTNCHECK HANG_PLUGIN.so PYTHON BAD_CLIENT.py
set -euo pipefail
set -m  # job control: a background job that ignored SIGINT could not be killed with it as Ctrl-C would
attncheck=$(realpath "$1") plugin=$(realpath "$2") python=$3 client=$(realpath "$4")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0

# Every process attncheck starts carries `marker` on its command line: the plug-in through a link named after
# it, the exec: client as an extra argument. Lists those still alive, attncheck itself (pid $1) excepted.
survivors() { pgrep -f -- "$marker" | grep -vx -- "$1" || true; }

check_one() {  # check_one SIGNAL SPEC DTYPE
  local sig=$1 spec=$2 pid found=""
  "$attncheck" check --impl "$spec" --dtype "$3" --timeout 600 --report-dir "$scratch/reports-$marker" --force --no-corpus \
    >"$scratch/out" 2>&1 &
  pid=$!
  # Wait until a child runs and a call has had time to start hanging (the first cases are answered at once).
  for _ in $(seq 100); do
    found=$(survivors "$pid")
    [ -n "$found" ] && break
    sleep 0.1
  done
  if [ -z "$found" ]; then
    echo "FAIL $sig $spec: no child process ever appeared"; cat "$scratch/out"; failed=1; kill -KILL "$pid" 2>/dev/null || true; return
  fi
  sleep 3
  if ! kill -"$sig" "$pid"; then
    echo "FAIL $sig $spec: attncheck ended before it could be killed"; cat "$scratch/out"; failed=1; return
  fi
  wait "$pid" || true
  for _ in $(seq 50); do  # the kernel delivers the parent-death signals at once; give the exits a moment
    found=$(survivors "$pid")
    [ -z "$found" ] && break
    sleep 0.1
  done
  if [ -n "$found" ]; then
    echo "FAIL $sig $spec: survivors after attncheck died:"
    ps -o pid,ppid,pgid,args -p "$(echo $found | tr ' ' ,)" || true
    for p in $found; do kill -KILL "$p" 2>/dev/null || true; done
    failed=1
  else
    echo "ok   $sig $spec: nothing outlived attncheck"
  fi
}

for sig in KILL TERM INT; do
  marker="attncheck-orphan-test-$$-$sig-plugin"
  ln -s "$plugin" "$scratch/$marker.so"
  check_one "$sig" "plugin:$scratch/$marker.so" float32
  marker="attncheck-orphan-test-$$-$sig-exec"
  check_one "$sig" "exec:$python $client hang $marker" float64
done
exit $failed
