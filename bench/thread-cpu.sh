#!/usr/bin/env bash
# thread-cpu.sh COMM DELAY SPAN: on a guest, the CPU time of the threads
# of the process named COMM other than its main thread (shunt's own
# threads in a preloaded job), over SPAN seconds starting DELAY seconds
# from now, as "helpers TICKS total TICKS" (clock ticks; total is every
# CPU state of the guest, idle included). Shell builtins only: a forked
# command on the guests' 9p root costs more than what it would measure.
comm=$1 delay=$2 span=$3
snap() {  # -> "helper_ticks total_ticks"
  local p= c n t s h=0 tot=0 x
  for c in /proc/[0-9]*/comm; do
    { read -r n < "$c"; } 2>/dev/null && [ "$n" = "$comm" ] && { p=${c%/comm}; p=${p#/proc/}; }
  done
  if [ -n "$p" ]; then
    for t in /proc/"$p"/task/*; do
      [ "${t##*/}" = "$p" ] && continue
      { read -r s < "$t/stat"; } 2>/dev/null || continue
      set -- ${s##*)}
      h=$((h + ${12} + ${13}))
    done
  fi
  read -r _ s < /proc/stat
  for x in $s; do tot=$((tot + x)); done
  echo "$h $tot"
}
sleep "$delay"
read -r h0 t0 <<< "$(snap)"
sleep "$span"
read -r h1 t1 <<< "$(snap)"
echo "helpers $((h1 - h0)) total $((t1 - t0))"
