#!/usr/bin/env bash
# Checks each patched crate under vendor/ against the crate published on crates.io at the
# same version, so that vendor/<crate>/QWEB.md stays a true account of the patch.
#
# For each vendor/<dir>: the crate's name and version come from its Cargo.toml; the published
# .crate (from cargo's registry cache, this script's cache in ~/.cache/qweb-check-vendor, else
# static.crates.io) must match the sha256 pinned in QWEB.md; it is unpacked, the paths QWEB.md's ```left-out block names are removed from it,
# and `diff -ruNa` against the vendored folder is split into hunks. It fails (exit 1) on
#   - a hunk that QWEB.md's ```hunks block does not list, with the same file, ranges and
#     sha256 of the changed lines (so any added or changed line fails until it is listed),
#   - a listed hunk that is not in the diff any more,
#   - a hunk whose added lines carry no `qweb:` marker, unless it is in a Cargo.toml or is
#     listed with a note `unmarked: <reason>`.
# It warns (never fails) when crates.io (its API, else its sparse index) has a newer patch
# release of the vendored minor line (0.4.20 when 0.4.21 is out), or when it cannot be asked.
# Without the published .crate (not cached, no network) it fails: nothing could be checked.
#
# Usage: scripts/check-vendor.sh [--print] [--no-version-check] [DIR...]
#   --print             print each crate's ```hunks block as it should read now (to paste
#                       into QWEB.md after reading the diff); notes are kept from the listed
#                       block where the hunk is the same
#   --no-version-check  skip the crates.io query for newer patch releases
#   DIR                 only these vendor/ folders (h2, rustls, ...); default all
#
# Format of the blocks in QWEB.md (lines starting with `#` are comments):
#   ```left-out
#   benches    # a file or folder of the published crate, from its root; `#` starts a comment
#   ```
#   ```hunks
#   crate NAME VERSION SHA256-OF-THE-.CRATE
#   PATH  -OLD,LEN  +NEW,LEN  SHA256[:16]-OF-THE-CHANGED-LINES  [note | unmarked: reason]
#   ```
# The changed lines of a hunk are its `+`, `-` and `\ No newline` lines, each with its newline.
#
# Needs bash, curl, tar, gzip, diff, sha256sum; python3 for the version check only.
set -euo pipefail

mode=check
version_check=1
only=()
while (($#)); do
    case $1 in
        --print) mode=print ;;
        --no-version-check) version_check=0 ;;
        -h | --help)
            sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
            exit 0
            ;;
        -*)
            echo "check-vendor: unknown option $1 (see --help)" >&2
            exit 2
            ;;
        *) only+=("${1%/}") ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-vendor.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

ua="qweb-check-vendor/1 (scripts/check-vendor.sh of the qweb web server)"
cache_dir=${QWEB_CHECK_VENDOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qweb-check-vendor}
errors=0

err() {
    echo "check-vendor: FAIL: $*" >&2
    errors=$((errors + 1))
}
warn() { echo "check-vendor: warning: $*" >&2; }

# block NAME FILE: the lines of FILE's ```NAME fenced block, less blank and `#` lines.
# Status 3 when FILE has no such block, 4 when it is not closed or appears twice.
block() {
    local name=$1 file=$2 line state=0 seen=0
    while IFS= read -r line || [[ -n $line ]]; do
        if ((state == 0)); then
            if [[ $line =~ ^\`\`\`${name}[[:space:]]*$ ]]; then
                ((seen == 0)) || return 4
                state=1 seen=1
            fi
        elif [[ $line =~ ^\`\`\` ]]; then
            state=0
        elif [[ $line =~ ^[[:space:]]*(#|$) ]]; then
            :
        else
            printf '%s\n' "$line"
        fi
    done <"$file"
    ((state == 0)) || return 4
    ((seen == 1)) || return 3
}

# package_field FIELD CARGO_TOML: a literal string field of [package].
package_field() {
    local re="^$1[[:space:]]*=[[:space:]]*\"([^\"]*)\"" line in=0
    while IFS= read -r line || [[ -n $line ]]; do
        if [[ $line =~ ^[[:space:]]*\[ ]]; then
            in=0
            [[ ! $line =~ ^\[package\][[:space:]]*$ ]] || in=1
        elif ((in)) && [[ $line =~ $re ]]; then
            printf '%s\n' "${BASH_REMATCH[1]}"
            return 0
        fi
    done <"$2"
    return 1
}

sha256() { sha256sum "$1" | cut -d' ' -f1; }

# sparse-index path of a crate name (cargo's layout)
index_path() {
    local n=${1,,}
    case ${#n} in
        1) echo "1/$n" ;;
        2) echo "2/$n" ;;
        3) echo "3/${n:0:1}/$n" ;;
        *) echo "${n:0:2}/${n:2:2}/$n" ;;
    esac
}

# newest_patch NAME VERSION OUT: writes "newest NEWEST" or "yanked" lines, or "unknown WHY".
newest_patch() {
    local name=$1 ver=$2 out=$3 body=$tmp/versions.$1 kind
    if ! command -v python3 >/dev/null; then
        echo "unknown python3 is not installed" >"$out"
        return 0
    fi
    if curl -fsS --connect-timeout 5 --max-time 15 -A "$ua" -o "$body" \
        "https://crates.io/api/v1/crates/$name/versions" 2>"$body.err"; then
        kind=api
    elif curl -fsS --connect-timeout 5 --max-time 15 -A "$ua" -o "$body" \
        "https://index.crates.io/$(index_path "$name")" 2>>"$body.err"; then
        kind=index
    else
        echo "unknown neither the crates.io API nor its index answered ($(tail -n1 "$body.err"))" >"$out"
        return 0
    fi
    python3 - "$ver" "$kind" "$body" >"$out" 2>&1 <<'EOF' || echo "unknown cannot read the answer" >"$out"
import json, re, sys
cur, kind, path = sys.argv[1:4]
text = open(path, encoding="utf-8").read()
if kind == "api":
    versions = [(v["num"], v.get("yanked", False)) for v in json.loads(text)["versions"]]
else:
    versions = [(v["vers"], v.get("yanked", False))
                for v in map(json.loads, filter(str.strip, text.splitlines()))]
def release(v):
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", v)  # no pre-release, no build metadata
    return tuple(map(int, m.groups())) if m else None
c = release(cur)
same_line = [r for r in (release(v) for v, yanked in versions if not yanked)
             if r and r[:2] == c[:2]]
if any(v == cur and yanked for v, yanked in versions):
    print("yanked")
if same_line:
    print("newest " + ".".join(map(str, max(same_line))))
else:
    print("unknown no release of the same minor line found")
EOF
}

# fetch_crate NAME VERSION PIN OUT: the published .crate into OUT, checked against PIN (a
# sha256, or empty where QWEB.md pins none yet). Says where it came from on stdout.
fetch_crate() {
    local name=$1 ver=$2 pin=$3 out=$4 f sum
    local file="$name-$ver.crate"
    for f in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$file" "$cache_dir/$file"; do
        [[ -f $f ]] || continue
        sum=$(sha256 "$f")
        if [[ -z $pin || $sum == "$pin" ]]; then
            cp "$f" "$out"
            echo "$f"
            return 0
        fi
        warn "$f has sha256 $sum, not the $pin of QWEB.md: not used"
    done
    if ! curl -fsSL --connect-timeout 10 --max-time 120 --retry 2 -A "$ua" -o "$out" \
        "https://static.crates.io/crates/$name/$file"; then
        return 1
    fi
    sum=$(sha256 "$out")
    if [[ -n $pin && $sum != "$pin" ]]; then
        echo "check-vendor: static.crates.io's $file has sha256 $sum, QWEB.md pins $pin" >&2
        return 1
    fi
    if mkdir -p "$cache_dir" 2>/dev/null && cp "$out" "$cache_dir/$file.part" 2>/dev/null; then
        mv "$cache_dir/$file.part" "$cache_dir/$file" || true
    fi
    echo "https://static.crates.io/crates/$name/$file"
}

# The hunks of a diff -ruN, as tab-separated lines: PATH OLD NEW HASH MARKED (1/0).
# PATH is relative to the vendored folder ($2). Fails on output it does not understand.
split_hunks() {
    local diff=$1 vend=$2 line path="" old="" new="" ro=0 rn=0 in=0 body="" marked=0 n
    local -a h
    emit() {
        if [[ -n $old ]]; then
            printf '%s\t%s\t%s\t%s\t%s\n' "$path" "$old" "$new" \
                "$(printf '%s' "$body" | sha256sum | cut -c1-16)" "$marked"
        fi
        old="" body="" marked=0
    }
    while IFS= read -r line || [[ -n $line ]]; do
        if ((in)); then
            case ${line:0:1} in
                ' ') ro=$((ro - 1)) rn=$((rn - 1)) ;;
                -) ro=$((ro - 1)) body+="$line"$'\n' ;;
                +)
                    rn=$((rn - 1)) body+="$line"$'\n'
                    [[ $line != *qweb:* ]] || marked=1
                    ;;
                \\) body+="$line"$'\n' ;;
                *)
                    echo "unexpected line in a hunk of $path: $line" >&2
                    return 1
                    ;;
            esac
            ((ro > 0 || rn > 0)) || in=0
            continue
        fi
        case $line in
            '\'*) body+="$line"$'\n' ;; # "\ No newline at end of file" after a hunk's last line
            'diff '*) emit ;;
            '--- '*) emit ;;
            '+++ '*)
                emit
                path=${line#'+++ '}
                path=${path%%$'\t'*}
                if [[ $path != "$vend"/* ]]; then
                    echo "unexpected file name in the diff: $line" >&2
                    return 1
                fi
                path=${path#"$vend"/}
                ;;
            '@@ '*)
                emit
                read -ra h <<<"$line"
                old=${h[1]} new=${h[2]}
                n=${old#-}
                [[ $n == *,* ]] && ro=${n#*,} || ro=1
                n=${new#+}
                [[ $n == *,* ]] && rn=${n#*,} || rn=1
                ((ro > 0 || rn > 0)) && in=1
                ;;
            *)
                echo "unexpected line in the diff: $line" >&2
                return 1
                ;;
        esac
    done <"$diff"
    emit
}

dirs=()
if ((${#only[@]})); then
    for d in "${only[@]}"; do dirs+=("vendor/${d#vendor/}"); done
else
    for d in vendor/*/; do dirs+=("${d%/}"); done
fi

# First the names and versions (the version queries run meanwhile).
declare -A crate_name crate_version
for dir in "${dirs[@]}"; do
    if [[ ! -f $dir/Cargo.toml ]]; then
        err "$dir: no Cargo.toml"
        continue
    fi
    if ! crate_name[$dir]=$(package_field name "$dir/Cargo.toml") ||
        ! crate_version[$dir]=$(package_field version "$dir/Cargo.toml"); then
        err "$dir/Cargo.toml: no literal name and version in [package]"
        unset "crate_name[$dir]" "crate_version[$dir]"
        continue
    fi
    if ((version_check)) && [[ $mode == check ]]; then
        newest_patch "${crate_name[$dir]}" "${crate_version[$dir]}" "$tmp/newest.${dir##*/}" &
    fi
done

for dir in "${dirs[@]}"; do
    [[ -n ${crate_name[$dir]:-} ]] || continue
    name=${crate_name[$dir]} ver=${crate_version[$dir]} qweb=$dir/QWEB.md
    errors_before=$errors
    if [[ ! -f $qweb ]]; then
        err "$dir: no QWEB.md"
        continue
    fi

    # the listed block
    rc=0
    listed=$(block hunks "$qweb") || rc=$?
    if ((rc == 4)); then
        err "$qweb: the \`\`\`hunks block is not closed, or there are two"
        continue
    elif ((rc != 0)) && [[ $mode == check ]]; then
        err "$qweb: no \`\`\`hunks block (scripts/check-vendor.sh --print ${dir##*/} prints it)"
    fi
    pin="" other_version=""
    declare -A note=() by_hash=() by_range=() matched=()
    while IFS= read -r line; do
        [[ -n $line ]] || continue
        read -r f1 f2 f3 f4 rest <<<"$line"
        if [[ $f1 == crate ]]; then
            if [[ $f2 != "$name" || $f3 != "$ver" ]]; then
                other_version="$f2 $f3"
            elif [[ ! $f4 =~ ^[0-9a-f]{64}$ ]]; then
                err "$qweb: \`crate\` line without the .crate's sha256: $line"
            else
                pin=$f4
            fi
            continue
        fi
        if [[ ! $f2 =~ ^-[0-9]+(,[0-9]+)?$ || ! $f3 =~ ^\+[0-9]+(,[0-9]+)?$ ||
            ! $f4 =~ ^[0-9a-f]{16}$ ]]; then
            err "$qweb: malformed hunk line: $line"
            continue
        fi
        key="$f1 $f2 $f3 $f4"
        if [[ -n ${note[$key]+x} ]]; then
            err "$qweb: hunk listed twice: $line"
        fi
        note[$key]=$rest
        by_hash["$f1 $f4"]="$f2 $f3"
        by_range["$f1 $f2 $f3"]=$f4
    done <<<"$listed"
    if [[ -n $other_version && $mode == check ]]; then
        # a diff against another version than the one listed says nothing useful
        err "$qweb lists crate $other_version, $dir/Cargo.toml is $name $ver: nothing" \
            "checked (after a rebase, list the hunks again: scripts/check-vendor.sh --print" \
            "${dir##*/})"
        unset note by_hash by_range matched
        continue
    elif [[ -z $pin && $mode == check ]]; then
        err "$qweb: no \`crate $name $ver <sha256>\` line in the hunks block"
    fi

    # the published crate
    crate=$tmp/$name-$ver.crate
    if ! from=$(fetch_crate "$name" "$ver" "$pin" "$crate"); then
        err "$dir: cannot get the published $name-$ver.crate (cargo's cache, $cache_dir," \
            "static.crates.io): nothing checked"
        continue
    fi
    pub=$tmp/pub.${dir##*/}
    mkdir "$pub"
    if ! tar -xzf "$crate" -C "$pub" || [[ ! -d $pub/$name-$ver ]]; then
        err "$from: not a .crate of $name-$ver"
        continue
    fi
    pub=$pub/$name-$ver

    # less what QWEB.md says was left out
    rc=0
    left_out=$(block left-out "$qweb") || rc=$?
    if ((rc == 4)); then
        err "$qweb: the \`\`\`left-out block is not closed, or there are two"
        continue
    fi
    while read -r p; do
        p=${p%%[[:space:]]#*} # a trailing comment
        p=${p%/}
        [[ -n $p ]] || continue
        if [[ $p == /* || /$p/ == */../* || /$p/ == */./* ]]; then
            err "$qweb: left-out path must be relative and plain: $p"
        elif [[ ! -e $pub/$p ]]; then
            err "$qweb: left-out $p is not in the published $name-$ver.crate"
        else
            rm -rf "${pub:?}/$p"
        fi
    done <<<"$left_out"
    cp "$qweb" "$pub/QWEB.md" # ours, not the crate's

    rc=0
    diff -ruNa "$pub" "$dir" >"$tmp/diff.${dir##*/}" || rc=$?
    if ((rc > 1)); then
        err "$dir: diff failed (status $rc)"
        continue
    fi
    if ! hunks=$(split_hunks "$tmp/diff.${dir##*/}" "$dir"); then
        err "$dir: cannot split the diff into hunks"
        continue
    fi
    count=0
    [[ -z $hunks ]] || count=$(wc -l <<<"$hunks")

    if [[ $mode == print ]]; then
        echo "$qweb ($name $ver, $count hunks):"
        echo '```hunks'
        echo "# path, old and new line ranges, sha256[:16] of the changed lines, note"
        echo "crate $name $ver $(sha256 "$crate")"
        while IFS=$'\t' read -r path old new hash marked; do
            [[ -n $path ]] || continue
            n=${note["$path $old $new $hash"]-}
            if [[ -z ${note["$path $old $new $hash"]+x} ]]; then
                # the same change moved, or a change at the same place: keep its note
                r=${by_hash["$path $hash"]-}
                if [[ -n $r ]]; then
                    n=${note["$path $r $hash"]-}
                elif [[ -n ${by_range["$path $old $new"]-} ]]; then
                    n=${note["$path $old $new ${by_range["$path $old $new"]}"]-}
                fi
            fi
            if ((marked)) && [[ $n == unmarked:* ]]; then
                n=""
            elif ((!marked)) && [[ ${path##*/} != Cargo.toml && $n != unmarked:?* ]]; then
                echo "# no qweb: marker below: add a '// qweb:' comment, or note 'unmarked: <reason>'"
            fi
            printf '%-36s %-10s %-10s %s%s\n' "$path" "$old" "$new" "$hash" "${n:+ $n}"
        done <<<"$hunks"
        echo '```'
        echo
        unset note by_hash by_range matched
        continue
    fi

    while IFS=$'\t' read -r path old new hash marked; do
        [[ -n $path ]] || continue
        key="$path $old $new $hash"
        where="$dir/$path: hunk @@ $old $new @@ (changed lines' sha256 $hash)"
        if [[ -z ${note[$key]+x} ]]; then
            # (the listed one it resembles is not reported again as missing)
            if [[ -n ${by_range["$path $old $new"]-} ]]; then
                err "$where differs from the one listed in $qweb (listed sha256" \
                    "${by_range["$path $old $new"]})"
                matched["$path $old $new ${by_range["$path $old $new"]}"]=1
            elif [[ -n ${by_hash["$path $hash"]-} ]]; then
                err "$where is listed in $qweb at ${by_hash["$path $hash"]}"
                matched["$path ${by_hash["$path $hash"]} $hash"]=1
            else
                err "$where is not listed in $qweb"
            fi
            continue
        fi
        matched[$key]=1
        n=${note[$key]}
        if [[ ${path##*/} == Cargo.toml ]]; then
            :
        elif ((marked)) && [[ $n == unmarked:* ]]; then
            err "$where is listed as unmarked in $qweb but carries a qweb: marker"
        elif ((!marked)) && [[ ! $n =~ ^unmarked:[[:space:]]*[^[:space:]] ]]; then
            err "$where has no qweb: marker on its added lines: add a '// qweb:' comment" \
                "or list it with 'unmarked: <reason>' in $qweb"
        fi
    done <<<"$hunks"
    for key in "${!note[@]}"; do
        if [[ -z ${matched[$key]+x} ]]; then
            read -r f1 f2 f3 f4 <<<"$key"
            err "$qweb lists $f1 @@ $f2 $f3 @@ ($f4), which is not in the diff any more"
        fi
    done
    if ((errors == errors_before)); then
        echo "check-vendor: $dir: $name $ver, $count hunks, all listed in QWEB.md"
    fi
    unset note by_hash by_range matched
done

if ((version_check)) && [[ $mode == check ]]; then
    wait
    for dir in "${dirs[@]}"; do
        [[ -n ${crate_name[$dir]:-} ]] || continue
        name=${crate_name[$dir]} ver=${crate_version[$dir]}
        out=$tmp/newest.${dir##*/}
        [[ -f $out ]] || continue
        while read -r what rest; do
            case $what in
                yanked) warn "$dir: $name $ver is yanked on crates.io" ;;
                newest)
                    if [[ $rest != "$ver" ]] &&
                        [[ $(printf '%s\n%s\n' "$ver" "$rest" | sort -V | tail -n1) == "$rest" ]]; then
                        warn "$dir: $name $ver is behind $rest, the newest patch release of" \
                            "${ver%.*} on crates.io (it may carry security fixes: read its" \
                            "changelog and rebase the patch; QWEB.md says how)"
                    fi
                    ;;
                *) warn "$dir: cannot tell whether $name $ver has newer patch releases: $rest" ;;
            esac
        done <"$out"
    done
fi

if ((errors)); then
    echo "check-vendor: $errors problem(s): the vendored crates and their QWEB.md disagree" >&2
    exit 1
fi
