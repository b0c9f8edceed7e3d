"""Users on every node: written into local files so logins and jobs never wait on a directory."""
