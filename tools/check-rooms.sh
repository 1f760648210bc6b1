#!/bin/bash
# check-rooms.sh [BUILD_DIR] - checks the layering of runtime/rooms.txt:
#  - every room names only rooms listed above it (so the graph has no cycle);
#  - every source file of the product lies in a room's folder;
#  - every #include "..." of a room's file names a header of the same room
#    or of a room it may use (those it names, and theirs, downward);
#  - with BUILD_DIR: no room's library calls a function defined in a room it
#    may not use (nm over BUILD_DIR/libmoerun_ROOM.a), and in the rooms of
#    FILE_ORDER_ROOMS the files call each other in one direction only (no
#    cycle among the objects of the room's library).
# Prints each offence as FILE:LINE: what, and exits 1 when there is one.
set -u
cd "$(dirname "$0")/.."
TABLE=runtime/rooms.txt
# rooms whose files must call each other without a cycle
FILE_ORDER_ROOMS="backend"
fail=0
declare -A dir_of room_of_dir may
rooms=()
while read -r room dir rest; do
  case $room in ''|\#*) continue ;; esac
  uses=${rest%%|*}
  allowed=" $room "
  for u in $uses; do
    [ "$u" = - ] && continue
    if [ -z "${dir_of[$u]:-}" ]; then
      echo "$TABLE: room $room uses '$u', which is not a room listed above it"
      fail=1
      continue
    fi
    allowed="$allowed${may[$u]} "
  done
  dir_of[$room]=$dir
  room_of_dir[$dir]=$room
  may[$room]=$(echo "$allowed" | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ' ')
  rooms+=("$room")
done <"$TABLE"

# files of the product outside every room
for f in $(git ls-files runtime attention router experts kvcache | grep -E '\.(c|h|cu|cuh)$'); do
  [ -n "${room_of_dir[$(dirname "$f")]:-}" ] || { echo "$f: in no room of $TABLE"; fail=1; }
done

for room in "${rooms[@]}"; do
  d=${dir_of[$room]}
  for f in "$d"/*.c "$d"/*.h "$d"/*.cu "$d"/*.cuh; do
    [ -f "$f" ] || continue
    while IFS=: read -r line inc; do
      case $inc in */*) ;; *) continue ;; esac  # a file beside it
      to=${room_of_dir[$(dirname "$inc")]:-}
      if [ -z "$to" ]; then
        echo "$f:$line: includes $inc, which is in no room"
        fail=1
      elif [[ " ${may[$room]} " != *" $to "* ]]; then
        echo "$f:$line: includes $inc (room $to), but room $room may use only: ${may[$room]}"
        fail=1
      fi
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | sed 's/^\([0-9]*\):.*"\([^"]*\)".*/\1:\2/')
  done
done

if [ $# -ge 1 ]; then
  B=$1
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for room in "${rooms[@]}"; do
    a=$B/libmoerun_$room.a
    [ -f "$a" ] || continue  # a room with headers only in this build
    nm -g --defined-only "$a" 2>/dev/null | awk 'NF >= 3 && $2 != "U" {print $3}' | sort -u >"$tmp/def.$room"
    nm -u "$a" 2>/dev/null | awk '{print $NF}' | sort -u >"$tmp/undef.$room"
  done
  for room in "${rooms[@]}"; do
    [ -f "$tmp/undef.$room" ] || continue
    for other in "${rooms[@]}"; do
      [[ " ${may[$room]} " == *" $other "* ]] && continue
      [ -f "$tmp/def.$other" ] || continue
      comm -12 "$tmp/undef.$room" "$tmp/def.$other" | while read -r sym; do
        echo "$B/libmoerun_$room.a: calls $sym, defined in room $other, which room $room may not use"
      done | tee -a "$tmp/calls"
    done
  done
  [ -s "$tmp/calls" ] && fail=1
  for room in $FILE_ORDER_ROOMS; do
    a=$PWD/$B/libmoerun_$room.a
    [ -f "$a" ] || continue
    mkdir -p "$tmp/x.$room" && (cd "$tmp/x.$room" && ar x "$a")
    for o in "$tmp/x.$room"/*.o; do
      nm -g --defined-only "$o" | awk -v f="$(basename "$o" .o)" 'NF >= 3 {print $3, f}'
    done | sort >"$tmp/fdef.$room"
    for o in "$tmp/x.$room"/*.o; do
      nm -u "$o" | awk -v f="$(basename "$o" .o)" '{print $NF, f}'
    done | sort | join - "$tmp/fdef.$room" | awk '$2 != $3 {print $2, $3}' | sort -u >"$tmp/fedges.$room"
    loop=$(tsort "$tmp/fedges.$room" 2>&1 >/dev/null | sed -n 's/^tsort: \([^ :]*\)$/\1/p' | tr '\n' ' ')
    if [ -n "$loop" ]; then
      echo "$B/libmoerun_$room.a: the files of room $room call each other in a cycle: $loop"
      fail=1
    fi
  done
fi

if [ $fail -eq 0 ]; then
  echo "rooms: ${#rooms[@]} rooms, includes${1:+ and calls} go downward only${1:+; the files of $FILE_ORDER_ROOMS call in one direction}"
fi
exit $fail
