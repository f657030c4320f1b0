# Sourced by the etcd test scripts.
# Waits until `file` has a line matching `pattern`, at most `seconds`.
wait_for() {
  local file="$1" pattern="$2" seconds="$3"
  if ! timeout "$seconds" bash -c "tail -n +1 -F '$file' 2>/dev/null | grep -q -m1 -e '$pattern'"; then
    echo "FAIL: no line matching '$pattern' in $file within $seconds s; it holds:" >&2
    tail -n 30 "$file" >&2 || true
    exit 1
  fi
}
