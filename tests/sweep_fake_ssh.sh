#!/bin/sh
# Stands in for ssh in the sweep's hosts test: "sweep_fake_ssh.sh [-o OPTION]... HOST COMMAND..."
# runs COMMAND here with sh, as ssh would on HOST, with SHOAL_TEST_SSH_HOST=HOST so that the
# program can tell which "host" it was started for. stdin, stdout, stderr and the exit status
# pass through as with ssh (the launcher sends the secret on stdin and watches it as a lifeline).
set -eu
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do
  case "$1" in -o) shift 2 ;; *) shift ;; esac   # ssh options: none apply here
done
host="$1"
shift
export SHOAL_TEST_SSH_HOST="$host"
exec sh -c "$*"
