# Slonk: ssh between the cluster's pods (`ssh <node>` to a node running one's job) with a key
# of one's own on the shared /home, made at one's first interactive login and trusted through
# ~/.ssh/authorized_keys, which every pod's sshd reads. Made by the user, in their own home;
# nothing is done for root or system accounts, nor when the user has an ed25519 key already.
# Interactive shells only (not every `bash -l` job), and one at a time: two logins at once
# must not leave a private key that does not match its .pub.
case $- in *i*)
    if [ "$(id -u)" -ge 1000 ] && [ -n "$HOME" ] && [ -O "$HOME" ] && [ ! -e "$HOME/.ssh/id_ed25519" ]; then
        (
            umask 077
            mkdir -p "$HOME/.ssh" && mkdir "$HOME/.ssh/.slonk-keygen" 2>/dev/null || exit 0
            trap 'rmdir "$HOME/.ssh/.slonk-keygen"' EXIT
            [ -e "$HOME/.ssh/id_ed25519" ] ||
                { ssh-keygen -q -t ed25519 -N '' -C "$(id -un)@slonk: ssh to the nodes of your jobs" \
                    -f "$HOME/.ssh/id_ed25519" </dev/null &&
                    cat "$HOME/.ssh/id_ed25519.pub" >>"$HOME/.ssh/authorized_keys"; }
        ) || echo "slonk: could not make ~/.ssh/id_ed25519 for ssh to the nodes of your jobs" >&2
    fi
    ;;
esac
