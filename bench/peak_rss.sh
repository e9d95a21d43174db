#!/usr/bin/env bash
# Run a command and print its peak anonymous and file-backed resident memory, sampled from
# /proc/PID/status every 0.1 s. Usage: bash bench/peak_rss.sh COMMAND [ARGS...]
"$@" &
pid=$!
peak_anon=0
peak_file=0
while kill -0 "$pid" 2>/dev/null; do
  read -r anon file < <(awk '/RssAnon/{a=$2}/RssFile/{f=$2}END{print a+0, f+0}' "/proc/$pid/status" 2>/dev/null)
  [ "${anon:-0}" -gt "$peak_anon" ] && peak_anon=$anon
  [ "${file:-0}" -gt "$peak_file" ] && peak_file=$file
  sleep 0.1
done
wait "$pid"
echo "peak RssAnon ${peak_anon} KB, peak RssFile ${peak_file} KB"
