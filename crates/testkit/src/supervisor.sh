# The supervisor of a throwaway PostgreSQL server, for the Rust suites (cluster.rs) and
# the Python suite (crates/python/tests/conftest.py): $1 temp dir, $2 bindir, $3 port,
# $4 unix socket dir (may be empty).
trap '' HUP INT TERM
dir=$1
if ! "$2/initdb" -D "$dir/data" -A trust -U postgres --no-sync -E UTF8 --locale=C \
    >"$dir/initdb.log" 2>&1 </dev/null; then
  echo initdb-failed
  tail -c 2048 "$dir/initdb.log"
  rm -rf "$dir"
  exit 1
fi
"$2/postgres" -D "$dir/data" -c listen_addresses=127.0.0.1 -p "$3" -k "$4" \
  -c max_connections=200 -c fsync=on >"$dir/server.log" 2>&1 </dev/null &
pid=$!
echo "started $pid"
while read -r _; do :; done
kill -INT "$pid" 2>/dev/null
wait "$pid"
rm -rf "$dir"
