#!/usr/bin/env bash
# Start or stop the real PostgreSQL 15 and MariaDB servers the tests and benchmarks use.
#   scripts/dbservers.sh start   # installs the Debian packages when missing, starts both on loopback
#   scripts/dbservers.sh stop
#   scripts/dbservers.sh restart-pg   # kill every PostgreSQL connection (pool-recovery test)
#   scripts/dbservers.sh env     # prints the export lines (also written to $SQLRL_DB_DIR/env.sh)
# Servers listen on 127.0.0.1 only, on non-default ports, with throwaway data directories.
set -euo pipefail
DIR=${SQLRL_DB_DIR:-/tmp/sqlrl-dbs}
PG_PORT=${SQLRL_PG_PORT:-55432}
MY_PORT=${SQLRL_MYSQL_PORT:-53306}
MY_ADMIN_PASSWORD=sqlrl-admin
# Settings sqlrl's prepare_server requires (docs/sessions.md, "Server settings"); a running server
# without them is restarted (its throwaway data directory is made anew).
PG_LOCKS=256                                          # max_locks_per_transaction
MY_TMP_PATH=ibtmp1:12M:autoextend:max:256M            # innodb_temp_data_file_path: bounded
# every temporary table InnoDB (so in the bounded ibtmp1; a session needs SUPER to change it), and
# one statement's internal temporary tables capped where no session can raise the cap (docs/sessions.md)
MY_TEMP_BOUNDS="--enforce-storage-engine=InnoDB --tmp-disk-table-size=256M --maximum-tmp-disk-table-size=256M \
  --maximum-tmp-memory-table-size=16M --maximum-tmp-table-size=16M --maximum-max-heap-table-size=16M"

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

install_packages() {
  local need=()
  [ -n "$(pg_bin)" ] || need+=(postgresql)
  command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need+=(mariadb-server)
  if [ ${#need[@]} -gt 0 ]; then
    echo "dbservers: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}

start_pg() {
  local bin; bin=$(pg_bin)
  local data=$DIR/pg
  # pg_ctl refuses to run as root: every call goes through runuser.
  if [ -f "$data/PG_VERSION" ] && runuser -u postgres -- "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    local locks
    locks=$(runuser -u postgres -- "$bin/psql" -h "$data" -p "$PG_PORT" -U postgres -Atc \
      "SHOW max_locks_per_transaction" postgres 2>/dev/null || true)
    [ "$locks" = "$PG_LOCKS" ] && return
    echo "dbservers: PostgreSQL runs without max_locks_per_transaction=$PG_LOCKS: restarting it"
  fi
  stop_pg
  rm -rf "$data"; mkdir -p "$data"; chown postgres:postgres "$data"
  runuser -u postgres -- "$bin/initdb" -D "$data" -U postgres --auth=trust >/dev/null
  runuser -u postgres -- "$bin/pg_ctl" -D "$data" -w -l "$data/server.log" -o \
    "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $data -c fsync=off -c synchronous_commit=off \
     -c full_page_writes=off -c max_connections=300 -c max_locks_per_transaction=$PG_LOCKS" \
     start >/dev/null
}

restart_pg() {  # used by the pool-recovery test: every server connection dies
  local bin; bin=$(pg_bin)
  runuser -u postgres -- "$bin/pg_ctl" -D "$DIR/pg" -m immediate -w restart -l "$DIR/pg/server.log" >/dev/null
}

stop_pg() {
  local bin; bin=$(pg_bin)
  [ -d "$DIR/pg" ] && runuser -u postgres -- "$bin/pg_ctl" -D "$DIR/pg" -m fast -w stop >/dev/null 2>&1 || true
  # a server whose data directory was removed under it still holds the port: end it too
  pkill -u postgres -f "postgres -D $DIR/pg" 2>/dev/null || true
  for _ in $(seq 1 40); do pgrep -u postgres -f "postgres -D $DIR/pg" >/dev/null || break; sleep 0.25; done
}

start_mysql() {
  local data=$DIR/mysql
  if [ -S "$data/s.sock" ] && mariadb-admin --socket="$data/s.sock" ping >/dev/null 2>&1; then
    local tmp
    tmp=$(mariadb --socket="$data/s.sock" -uroot -Nse "SELECT @@innodb_temp_data_file_path, @@global.enforce_storage_engine, @@global.tmp_disk_table_size" 2>/dev/null || true)
    [ "$tmp" = "$MY_TMP_PATH	InnoDB	268435456" ] && return
    echo "dbservers: MariaDB runs without innodb_temp_data_file_path=$MY_TMP_PATH and $MY_TEMP_BOUNDS: restarting it"
  fi
  stop_mysql
  rm -rf "$data"; mkdir -p "$data"; chown mysql:mysql "$data" 2>/dev/null || chown -R mysql "$data"
  mariadb-install-db --no-defaults --user=mysql --datadir="$data" \
    --auth-root-authentication-method=socket >/dev/null 2>&1
  # lower_case_table_names=1: Spider's SQL names tables in any case, as SQLite allows.
  mariadbd --no-defaults --user=mysql --datadir="$data" --socket="$data/s.sock" --port="$MY_PORT" \
    --bind-address=127.0.0.1 --pid-file="$data/mariadb.pid" --log-error="$data/error.log" \
    --lower-case-table-names=1 --innodb-buffer-pool-size=128M --innodb-flush-log-at-trx-commit=0 \
    --innodb-doublewrite=0 --max-connections=500 --skip-name-resolve --symbolic-links=0 \
    --innodb-temp-data-file-path="$MY_TMP_PATH" $MY_TEMP_BOUNDS \
    >/dev/null 2>&1 &
  for _ in $(seq 1 60); do
    mariadb-admin --socket="$data/s.sock" ping >/dev/null 2>&1 && break; sleep 0.5
  done
  mariadb --socket="$data/s.sock" -uroot -e "
    CREATE USER IF NOT EXISTS 'sqlrl_admin'@'127.0.0.1' IDENTIFIED BY '$MY_ADMIN_PASSWORD';
    GRANT ALL PRIVILEGES ON *.* TO 'sqlrl_admin'@'127.0.0.1' WITH GRANT OPTION;
    FLUSH PRIVILEGES;"
}

stop_mysql() {
  local data=$DIR/mysql
  if [ -f "$data/mariadb.pid" ]; then
    local pid; pid=$(cat "$data/mariadb.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  fi
  pkill -u mysql -f "mariadbd --no-defaults --user=mysql --datadir=$data" 2>/dev/null || true
}

write_env() {
  cat > "$DIR/env.sh" <<ENV
export SQLRL_PG_ADMIN_URL=postgresql://postgres@127.0.0.1:$PG_PORT/postgres
export SQLRL_MYSQL_ADMIN_URL=mysql://sqlrl_admin:$MY_ADMIN_PASSWORD@127.0.0.1:$MY_PORT/mysql
# these servers' own settings: a later 'dbservers.sh restart-pg' (the pool-recovery test) acts on them
export SQLRL_DB_DIR=$DIR SQLRL_PG_PORT=$PG_PORT SQLRL_MYSQL_PORT=$MY_PORT
ENV
}

case "${1:-}" in
  start) mkdir -p "$DIR"; chmod 755 "$DIR"; install_packages; start_pg; start_mysql; write_env
         echo "dbservers: PostgreSQL on 127.0.0.1:$PG_PORT, MariaDB on 127.0.0.1:$MY_PORT (env: $DIR/env.sh)";;
  stop) stop_pg; stop_mysql; echo "dbservers: stopped";;
  restart-pg) restart_pg; echo "dbservers: PostgreSQL restarted";;
  env) write_env; cat "$DIR/env.sh";;
  *) echo "usage: $0 start|stop|restart-pg|env" >&2; exit 2;;
esac
