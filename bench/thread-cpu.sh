#!/usr/bin/env bash
# thread-cpu.sh COMM DELAY SPAN: on a guest, the CPU time of the threads
# of the process named COMM other than its main thread (shunt's own
# threads in a preloaded job), over SPAN seconds starting DELAY seconds
# from now, as "helpers TICKS total TICKS idle TICKS" (clock ticks; total
# is every CPU state of the guest, idle included). Shell builtins only: a forked
# command on the guests' 9p root costs more than what it would measure.
# THREAD_CPU_DETAIL=1 also prints "thread NAME TICKS" for each helper
# thread (threads of one name summed), to see which of them costs.
comm=$1 delay=$2 span=$3
declare -A by0 by1
snap() {  # -> "helper_ticks total_ticks idle_ticks"; the per-name ticks in by[]
  local p= c n t s h=0 tot=0 x
  by=()
  for c in /proc/[0-9]*/comm; do
    { read -r n < "$c"; } 2>/dev/null && [ "$n" = "$comm" ] && { p=${c%/comm}; p=${p#/proc/}; }
  done
  if [ -n "$p" ]; then
    for t in /proc/"$p"/task/*; do
      [ "${t##*/}" = "$p" ] && continue
      { read -r s < "$t/stat"; } 2>/dev/null || continue
      set -- ${s##*)}
      h=$((h + ${12} + ${13}))
      if [ -n "$THREAD_CPU_DETAIL" ]; then
        { read -r n < "$t/comm"; } 2>/dev/null || n=?
        by[$n]=$((${by[$n]:-0} + ${12} + ${13}))
      fi
    done
  fi
  read -r _ s < /proc/stat
  for x in $s; do tot=$((tot + x)); done
  set -- $s
  echo "$h $tot $4"
}
declare -A by
sleep "$delay"
snap > "${TMPDIR:-/tmp}/thread-cpu.$$"
read -r h0 t0 i0 < "${TMPDIR:-/tmp}/thread-cpu.$$"
for n in "${!by[@]}"; do by0[$n]=${by[$n]}; done
sleep "$span"
snap > "${TMPDIR:-/tmp}/thread-cpu.$$"
read -r h1 t1 i1 < "${TMPDIR:-/tmp}/thread-cpu.$$"
rm -f "${TMPDIR:-/tmp}/thread-cpu.$$"
echo "helpers $((h1 - h0)) total $((t1 - t0)) idle $((i1 - i0))"
for n in "${!by[@]}"; do echo "thread $n $((${by[$n]} - ${by0[$n]:-0}))"; done
