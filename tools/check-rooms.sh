#!/bin/bash
# check-rooms.sh [BUILD_DIR] - checks the layering of runtime/rooms.txt:
#  - every room names only rooms listed above it (so the graph has no cycle);
#  - every source file of the product lies in a room's folder;
#  - every #include "..." of a room's file names a header of the same room
#    or of a room it may use (those it names, and theirs, downward);
#  - with BUILD_DIR: no room's library calls a function defined in a room it
#    may not use (nm over BUILD_DIR/libmoerun_ROOM.a).
# Prints each offence as FILE:LINE: what, and exits 1 when there is one.
set -u
cd "$(dirname "$0")/.."
TABLE=runtime/rooms.txt
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
fi

if [ $fail -eq 0 ]; then
  echo "rooms: ${#rooms[@]} rooms, includes${1:+ and calls} go downward only"
fi
exit $fail
