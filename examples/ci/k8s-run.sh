#!/bin/bash
# Runs the shards, then the merge, in order, and exits with the merge's verdict (0 held, 1 falsified, 2, 4).
# The shared volume keeps the corpus between runs; last run's shards and report are the two Jobs' to replace.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kubectl delete job attncheck-shards attncheck-merge --ignore-not-found
kubectl apply -f "$here/k8s-shards.yaml"
# Complete (every index succeeded) or Failed (a shard exited 2 or 4, or ran out of retries): wait for either.
until kubectl get job attncheck-shards -o jsonpath='{.status.conditions[*].type}' | grep -Eq 'Complete|Failed'; do
  sleep 10
done
if kubectl get job attncheck-shards -o jsonpath='{.status.conditions[*].type}' | grep -q Failed; then
  echo "attncheck: a shard failed (exit 2 or 4); its pod's log says why" >&2
  exit 2
fi
kubectl apply -f "$here/k8s-merge.yaml"
until kubectl get job attncheck-merge -o jsonpath='{.status.conditions[*].type}' | grep -Eq 'Complete|Failed'; do
  sleep 5
done
kubectl logs job/attncheck-merge
code=$(kubectl get pods -l job-name=attncheck-merge -o jsonpath='{.items[0].status.containerStatuses[0].state.terminated.exitCode}')
exit "${code:-2}"
