#!/usr/bin/env bash
# thread-cpu.sh COMM DELAY SPAN: on a guest, the CPU time of the threads
# of the process named COMM that bear another name (shunt's own threads in
# a preloaded job; the program's own keep COMM, as its main thread), over
# SPAN seconds starting DELAY seconds from now, as "helpers TICKS total
# TICKS idle TICKS" (clock ticks; total
# is every CPU state of the guest, idle included). Shell builtins only: a forked
# command on the guests' 9p root costs more than what it would measure.
# THREAD_CPU_DETAIL=1 also prints "thread NAME TICKS" for each helper
# thread (threads of one name summed), to see which of them costs.
comm=$1 delay=$2 span=$3
declare -A ticks name first
# snap: the guest's "total idle" ticks on stdout's file; each helper thread's
# ticks in ticks[TID] (and its name in name[TID]), from scratch
snap() {
  local p= c n t s tot=0 x
  ticks=()
  for c in /proc/[0-9]*/comm; do
    { read -r n < "$c"; } 2>/dev/null && [ "$n" = "$comm" ] && { p=${c%/comm}; p=${p#/proc/}; }
  done
  if [ -n "$p" ]; then
    for t in /proc/"$p"/task/*; do
      [ "${t##*/}" = "$p" ] && continue
      { read -r n < "$t/comm"; } 2>/dev/null || n=?
      [ "$n" = "$comm" ] && continue
      { read -r s < "$t/stat"; } 2>/dev/null || continue
      set -- ${s##*)}
      ticks[${t##*/}]=$((${12} + ${13}))
      name[${t##*/}]=$n
    done
  fi
  read -r _ s < /proc/stat
  for x in $s; do tot=$((tot + x)); done
  set -- $s
  echo "$tot $4"
}
sleep "$delay"
snap > "${TMPDIR:-/tmp}/thread-cpu.$$"
read -r t0 i0 < "${TMPDIR:-/tmp}/thread-cpu.$$"
for tid in "${!ticks[@]}"; do first[$tid]=${ticks[$tid]}; done
sleep "$span"
snap > "${TMPDIR:-/tmp}/thread-cpu.$$"
read -r t1 i1 < "${TMPDIR:-/tmp}/thread-cpu.$$"
rm -f "${TMPDIR:-/tmp}/thread-cpu.$$"
# Per thread, by its id: a thread that exited within the span is left out
# (summed over whatever threads each snapshot found, one that exited, or a
# snapshot of another process, made the share negative); one born within
# it counts whole.
declare -A by
h=0
for tid in "${!ticks[@]}"; do
  d=$((${ticks[$tid]} - ${first[$tid]:-0}))
  [ $d -lt 0 ] && d=0
  h=$((h + d))
  by[${name[$tid]}]=$((${by[${name[$tid]}]:-0} + d))
done
echo "helpers $h total $((t1 - t0)) idle $((i1 - i0))"
if [ -n "$THREAD_CPU_DETAIL" ]; then
  for n in "${!by[@]}"; do echo "thread $n ${by[$n]}"; done
fi
