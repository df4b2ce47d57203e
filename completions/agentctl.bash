# bash completion for agentctl (weightfloor)                                  -*- shell-script -*-
#
# Installed as share/bash-completion/completions/agentctl (bash-completion loads it on first use);
# it can also be sourced directly, as it needs nothing from bash-completion. Completes commands,
# global and per-command flags, and asks the agent for model names and worker ids
# (`agentctl --json models`, `agentctl --json workers`), passing on the connection flags already on
# the line. The JSON is read with grep and sed so that completion needs no jq.

_agentctl_commands="inspect status models register floor publish reload perplexity watch workers
residency pin unpin evict prefetch compact generate"
_agentctl_global_flags="--socket --events --json --output -o --timeout --quiet -q --tls-ca
--tls-cert --tls-key --tls-server-name --help --version"

# Prints the values of one string field ("name", "worker_id") of a JSON document, one a line.
_agentctl_json_field()
{
	grep -o "\"$1\"[[:space:]]*:[[:space:]]*\"[^\"]*\"" | sed -e 's/^[^:]*:[[:space:]]*"//' -e 's/"$//' \
		-e 's#\\/#/#g' | sort -u
}

# _agentctl_ask FIELD COMMAND: the FIELD values in `agentctl --json COMMAND`, quietly and quickly:
# a stopped agent must not hang the shell.
_agentctl_ask()
{
	"${_agentctl_prog:-agentctl}" "${_agentctl_conn[@]}" --timeout 2000 --json "$2" 2>/dev/null |
		_agentctl_json_field "$1"
}

_agentctl_files()
{
	if declare -F _filedir >/dev/null; then
		_filedir
	else
		local IFS=$'\n'
		COMPREPLY=($(compgen -f -- "$cur"))
	fi
}

_agentctl_complete_from()
{
	local IFS=$'\n'
	COMPREPLY=($(compgen -W "$1" -- "$cur"))
}

_agentctl()
{
	local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
	local cmd="" sub="" i w npos=0
	_agentctl_prog="${COMP_WORDS[0]}"
	_agentctl_conn=()
	COMPREPLY=()

	# Walk the words before the cursor: connection flags (kept for the agent queries), the command,
	# the floor sub-command, and how many positional arguments the command has so far.
	for ((i = 1; i < COMP_CWORD; i++)); do
		w="${COMP_WORDS[i]}"
		case "$w" in
		--socket | --events | --tls-ca | --tls-cert | --tls-key | --tls-server-name | -s | -e)
			_agentctl_conn+=("$w" "${COMP_WORDS[i+1]}")
			((i++))
			continue
			;;
		--socket=* | --events=* | --tls-*=*)
			_agentctl_conn+=("$w")
			continue
			;;
		--timeout | -t | --output | -o | --worker | -w | --count | --for | --wait-timeout | \
			--prompt-ids | --max-tokens | --temp | --top-k | --top-p | --min-p | \
			--repeat-penalty | --repeat-last-n | --seed | --stop | --tensor)
			((i++))
			continue
			;;
		=)
			# NAME=FILE split by COMP_WORDBREAKS: "=" and the FILE after it are --tensor's
			((i++))
			continue
			;;
		-*) continue ;;
		esac
		if [[ -z $cmd ]]; then
			cmd="$w"
		elif [[ $cmd == floor && -z $sub ]]; then
			sub="$w"
		else
			((npos++))
		fi
	done

	# --tensor NAME=FILE: files after the "=" (a word of its own when COMP_WORDBREAKS has "=").
	if [[ $prev == = && $COMP_CWORD -ge 3 && ${COMP_WORDS[COMP_CWORD-3]} == --tensor ]]; then
		_agentctl_files
		return
	fi
	if [[ $prev == --tensor ]]; then
		if [[ $cur == *=* ]]; then
			local name="${cur%%=*}="
			cur="${cur#*=}"
			_agentctl_files
			COMPREPLY=("${COMPREPLY[@]/#/$name}")
		fi
		return
	fi

	# The argument of a flag.
	case "$prev" in
	--socket | --events | -s | -e)
		_agentctl_complete_from $'ipc:///run/weightfloor/agent.sock\nipc:///run/weightfloor/events.sock\ntcp://\ntls+tcp://'
		return
		;;
	--tls-ca | --tls-cert | --tls-key)
		_agentctl_files
		return
		;;
	--output | -o)
		_agentctl_complete_from $'json\nwide'
		return
		;;
	--worker | -w)
		_agentctl_complete_from "$(_agentctl_ask worker_id workers)"
		return
		;;
	--timeout | -t | --tls-server-name | --count | --for | --wait-timeout | --prompt-ids | \
		--max-tokens | --temp | --top-k | --top-p | --min-p | --repeat-penalty | \
		--repeat-last-n | --seed | --stop)
		return
		;;
	esac

	local flags=""
	case "$cmd" in
	"") flags="" ;;
	inspect | status | workers) flags="--json --help" ;;
	models) flags="--json --help" ;;
	register) flags="--pin --json --help" ;;
	floor)
		case "$sub" in
		ensure) flags="--no-wait --wait-timeout --json --help" ;;
		*) flags="--json --help" ;;
		esac
		;;
	watch) flags="--count --for --json --help" ;;
	publish) flags="--tensor --dry-run --json --help" ;;
	reload) flags="--dry-run --json --help" ;;
	perplexity)
		flags="--file --ctx --chunks --worker --kl-base --save-base --swap-loop --pre-reload
--base-file --max-iterations --json --help"
		;;
	residency | pin | unpin | evict | prefetch | compact) flags="--worker --all --json --help" ;;
	generate)
		flags="--worker --prompt-ids --max-tokens --temp --top-k --top-p --min-p --repeat-penalty
--repeat-last-n --seed --stop --ignore-eos --json --help"
		;;
	esac

	if [[ $cur == -* ]]; then
		_agentctl_complete_from "$(printf '%s\n' $flags $_agentctl_global_flags | sort -u)"
		return
	fi

	case "$cmd" in
	"") _agentctl_complete_from "$(printf '%s\n' $_agentctl_commands)" ;;
	inspect) _agentctl_files ;;
	models) ((npos == 0)) && _agentctl_complete_from "$(_agentctl_ask name models)" ;;
	register) ((npos == 1)) && _agentctl_files ;;
	publish | reload | perplexity) ((npos == 0)) && _agentctl_complete_from "$(_agentctl_ask name models)" ;;
	floor)
		if [[ -z $sub ]]; then
			_agentctl_complete_from $'ensure\nrelease\npin\nunpin'
		elif ((npos == 0)); then
			_agentctl_complete_from "$(_agentctl_ask name models)"
		fi
		;;
	residency)
		if ((npos == 0)); then
			_agentctl_complete_from "$(_agentctl_ask name models)"
		elif ((npos == 1)); then
			_agentctl_complete_from $'disk\nhost\ndevice\npinned_device'
		fi
		;;
	pin | unpin | evict | prefetch)
		((npos == 0)) && _agentctl_complete_from "$(_agentctl_ask name models)"
		;;
	compact) _agentctl_complete_from "$(_agentctl_ask name models)" ;;
	generate) ((npos == 0)) && _agentctl_complete_from "$(_agentctl_ask name models)" ;;
	esac
	return 0
}

complete -F _agentctl agentctl
