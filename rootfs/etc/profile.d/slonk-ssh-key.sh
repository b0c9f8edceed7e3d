# Slonk: ssh between the cluster's pods (`ssh <node>` to a node running one's job) with a key
# of one's own on the shared /home, made at one's first login shell and trusted through
# ~/.ssh/authorized_keys, which every pod's sshd reads. Made by the user, in their own home;
# nothing is done for root or system accounts, nor when the user has an ed25519 key already.
if [ "$(id -u)" -ge 1000 ] && [ -n "$HOME" ] && [ -O "$HOME" ] && [ ! -e "$HOME/.ssh/id_ed25519" ]; then
    (
        umask 077
        mkdir -p "$HOME/.ssh" &&
            ssh-keygen -q -t ed25519 -N '' -C "$(id -un)@slonk: ssh to the nodes of your jobs" \
                -f "$HOME/.ssh/id_ed25519" </dev/null &&
            cat "$HOME/.ssh/id_ed25519.pub" >>"$HOME/.ssh/authorized_keys"
    ) || echo "slonk: could not make ~/.ssh/id_ed25519 for ssh to the nodes of your jobs" >&2
fi
