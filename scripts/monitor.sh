#!/usr/bin/env bash
# Monitoring in one command: Debian's Prometheus scraping Ray's own service discovery, with sqlrl's
# console page (graphs of a training run) at /consoles/sqlrl.html. Details: docs/monitoring.md.
#   bash scripts/monitor.sh start       # installs Debian's prometheus when missing; starts a Ray head
#                                       # (RAY_PROMETHEUS_HOST set) when none runs; prints the addresses
#   bash scripts/monitor.sh status      # addresses, scrape targets up, whether the dashboard sees it
#   bash scripts/monitor.sh stop        # stops what start started (never another Ray on the machine)
#   bash scripts/monitor.sh screenshot OUT.png [--range 10m] [--size 1600x2600]
#                                       # the console page in headless Chromium (installed when missing)
#   bash scripts/monitor.sh install [prometheus] [chromium]   # only install the Debian packages
#                                       # (default: prometheus; e.g. in a cluster's setup commands)
# Settings (environment): SQLRL_PROM_PORT (9090), SQLRL_RAY_PORT (6379), SQLRL_DASHBOARD_PORT (8265),
# SQLRL_METRICS_EXPORT_PORT (8080), SQLRL_MONITOR_DIR (/tmp/sqlrl-monitor), SQLRL_RAY_TEMP_DIR,
# SQLRL_PROM_SCRAPE_S (5), SQLRL_RAY_CPUS (8), SQLRL_RAY_START_ARGS, SQLRL_PROMETHEUS, SQLRL_CHROMIUM,
# SQLRL_APT_GET (apt-get). Runs in the project's environment (.venv, made by scripts/setup.sh).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$SQLRL_ROOT"
APT_GET=${SQLRL_APT_GET:-apt-get}

usage() { echo "usage: $0 start|stop|status|install [prometheus] [chromium]|screenshot OUT.png [--range 10m] [--size WxH]" >&2; exit 2; }

# Install a Debian package when its binary is missing (as scripts/dbservers.sh does); a clear error
# when that cannot work (no apt-get, not root, the package cannot be installed).
ensure_package() {  # ensure_package BINARY PACKAGE VARIABLE [EXTRA PACKAGE...]
  local binary=$1 package=$2 variable=$3
  shift 3
  command -v "$binary" >/dev/null 2>&1 && return 0
  command -v "$APT_GET" >/dev/null 2>&1 \
    || sqlrl_die "$binary is not installed and $APT_GET is not available: install Debian's $package package, or set $variable to a $package binary"
  [ "$(id -u)" = 0 ] \
    || sqlrl_die "$binary is not installed: run 'apt-get install $package' as root, or set $variable to a $package binary"
  echo "monitor: installing Debian's $package"
  { "$APT_GET" update -qq && DEBIAN_FRONTEND=noninteractive "$APT_GET" install -y -qq --no-install-recommends \
      "$package" "$@" >/dev/null; } \
    || sqlrl_die "$APT_GET could not install $package (above): install it by hand, or set $variable to a $package binary"
  command -v "$binary" >/dev/null 2>&1 || sqlrl_die "$package is installed but $binary is not on PATH: set $variable"
}

need_prometheus() { ensure_package "${SQLRL_PROMETHEUS:-prometheus}" prometheus SQLRL_PROMETHEUS; }
need_chromium() { ensure_package "${SQLRL_CHROMIUM:-chromium}" chromium SQLRL_CHROMIUM fonts-liberation; }

cmd=${1:-}
case "$cmd" in
  start) need_prometheus ;;
  screenshot) [ $# -ge 2 ] || usage; need_chromium ;;
  stop|status) ;;
  install) shift
           for package in "${@:-prometheus}"; do
             case "$package" in
               prometheus) need_prometheus ;;
               chromium) need_chromium ;;
               *) echo "monitor: install: unknown package '$package' (prometheus, chromium)" >&2; exit 2 ;;
             esac
             echo "monitor: $package is installed"
           done
           exit 0 ;;
  *) usage ;;
esac
sqlrl_activate
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}  # as scripts/ray_stages.sh: Ray >= 2.59 local clusters use tokens
if [ "$cmd" = screenshot ]; then
  out=$2; shift 2
  exec python -m jobs.monitor screenshot --out "$out" "$@"
fi
exec python -m jobs.monitor "$cmd"
