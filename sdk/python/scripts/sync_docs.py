"""The sync client's docstrings, where they are not the async client's with its names.

``scripts/unasync.py`` writes each in place of the async docstring of the same place
(sync names: ``SandboxClient.create_sandbox`` for ``AsyncSandboxClient.create_sandbox``)
in the generated ``_sync*`` modules: the classes and functions below only say where. The
async docstrings are short and point to these, which are the reference (with examples
that ``tests/test_docs.py`` runs). An entry whose place is gone fails the generation.
"""

#: Docstrings of generated modules, by module name (lines not indented).
MODULE_DOCS = {
    "_sync": """The synchronous client: :class:`SandboxClient` and :class:`SandboxInstance`.

>>> with SandboxClient() as client:
...     with client.create_sandbox("busybox:latest") as sandbox:
...         print(sandbox.exec("echo 'Hello, Orchard!'").stdout)
Hello, Orchard!
<BLANKLINE>
""",
}

# --- _sync_client.py ----------------------------------------------------------


class SandboxClient:
    """A connection to an Orchard server; makes and finds sandboxes.

    Arguments default to the environment: ``SANDBOX_BASE_URL`` (then
    ``http://localhost:8000``), ``SANDBOX_API_KEY`` and ``SANDBOX_PREFIX`` (the start
    of the ids of the sandboxes it creates). ``timeout`` is the HTTP time-out in
    seconds (and how long ``exec`` waits for a command without a time limit of its
    own). With ``auto_cleanup`` (the default) every sandbox it creates is deleted when
    the client's ``with`` block ends, at interpreter exit, and on SIGINT/SIGTERM.
    Transient failures are retried by ``retry`` (3 times, exponential backoff with
    jitter; a command is never sent twice). ``direct=True`` sends the ``/v1`` sandbox
    calls to each sandbox's agent itself (its Unix socket, or its address) instead of
    through the server.

    >>> client.health()["status"]
    'healthy'
    """

    def create_sandbox(self):
        """Creates a sandbox from ``image`` and (by default) waits until it is ready.

        ``cpu`` like ``"2"`` or ``"500m"``, ``memory`` like ``"1Gi"``; ``timeout`` is how
        long readiness may take, in seconds (the server's limit when ``None``). The wait
        is server-side (``/wait``), so ``poll_interval`` is accepted for compatibility
        and not needed. ``env``, ``labels`` and ``ttl`` (seconds) use the ``/v1`` API.
        A sandbox that fails to start is deleted and :class:`~orchard_env.SandboxError`
        (a ``RuntimeError``) raised; one not ready in time, a ``TimeoutError``. One no
        node can take yet (``unschedulable``, on a Kubernetes server) is waited for, not
        failed: ``[ID] Waiting for node... (Ns elapsed): MSG`` is printed every 30 s.

        >>> with client.create_sandbox("busybox:latest", memory="256Mi") as sb:
        ...     sb.info.status, sb.sandbox_id.startswith(client.prefix)
        ('ready', True)
        """

    def cleanup_all(self):
        """Deletes every sandbox this client created and has not deleted; returns their ids."""


# --- _sync_snapshots.py -------------------------------------------------------


class ClientSnapshots:
    def fork(self):
        """Starts ``k`` sandboxes (1 to 64) from ``snapshot`` (a
        :class:`~orchard_env.Snapshot` or its id) and returns them once all are ready.

        Each fork is a sandbox like those :meth:`create_sandbox` makes (a context
        manager; owned by this client and deleted by its cleanup) with the snapshot's
        filesystem, image, environment variables, CPU, memory and network, and its shell
        sessions back (the same session ids, working directories, exported variables and
        functions: :meth:`SandboxInstance.get_session` finds them). Running processes
        are not carried into forks: snapshots do not capture them (no process
        checkpointing; CRIU is not available on the servers' kernel), so a fork starts
        with no process but its agent and its restored sessions. The forks share the
        snapshot's layers (nothing is copied; each writes to its own layer, so they
        diverge independently), and the snapshot cannot be deleted while any of them
        exists. ``labels`` are the forks' labels; ``ttl_s`` is how long each fork lives
        (the server's default when ``None``, 0 until deleted); ``ready_timeout_s`` how
        long readiness may take; ``direct`` as in :meth:`create_sandbox`. All or
        nothing: if one fork cannot start, none is left (:class:`~orchard_env.SandboxError`).

        >>> with client.create_sandbox("busybox:latest") as parent:
        ...     _ = parent.write_file("/workspace/turn", "3")
        ...     snap = parent.snapshot()
        >>> forks = client.fork(snap, 2)
        >>> [f.read_file("/workspace/turn") for f in forks]
        [b'3', b'3']
        >>> for f in forks:
        ...     f.delete()
        >>> client.delete_snapshot(snap) >= 0
        True
        """


# --- _sync_sandbox.py ---------------------------------------------------------


class SandboxInstance:
    """One sandbox. A context manager: leaving the ``with`` block deletes it.

    The compatible methods (``exec``, ``apply_patch``, ``upload_file``, ...) use the
    Orchard-compatible routes; the others use ``/v1`` (through the server, or straight
    to the sandbox's agent for a ``direct`` sandbox).
    """

    def pause(self):
        """Freezes the sandbox: its processes stop where they are, keep their memory, and
        use no CPU until :meth:`resume`. Returns (and stores in :attr:`info`) the
        sandbox's ``/v1`` description, ``paused`` set and ``status`` ``"paused"``.

        While paused, the server answers the sandbox's exec, file, process, session,
        terminal and git calls (compatible and ``/v1`` alike) with 409:
        :class:`~orchard_env.ConflictError` whose message says it is paused. A
        ``direct`` sandbox's calls go to its frozen agent and wait until the resume.
        Heartbeats and the time to live go on; pausing a paused sandbox is harmless.

        >>> sandbox.pause().status, sandbox.paused
        ('paused', True)
        >>> sandbox.resume().status, sandbox.paused
        ('running', False)
        """

    def snapshot(self):
        """Captures the sandbox as an immutable :class:`~orchard_env.Snapshot` that
        :meth:`SandboxClient.fork` starts new sandboxes from.

        What is captured: the filesystem changes since the image (the local backend's
        in-memory ``/tmp`` included, copied into each fork), the image, environment,
        CPU, memory and network, and each live shell session's working directory,
        exported variables and functions. Running processes are NOT captured, and are
        never carried into forks: there is no process checkpointing (CRIU is not
        available on the servers' kernel). The sandbox is frozen only for the capture
        (``frozen_ms``) and goes on unchanged. Snapshots are content-addressed: the
        same state and ``labels`` give the same snapshot (an equal one taken before is
        answered, its ``sandbox_id`` that of its own sandbox). Forks share the snapshot's
        layers, and it cannot be deleted while any fork exists
        (:meth:`SandboxClient.delete_snapshot`). Snapshots count against the API key's
        snapshot bytes quota: :class:`~orchard_env.QuotaError` (429) past it.

        >>> snap = sandbox.snapshot(labels={"turn": "3"})
        >>> snap.labels, snap.processes, snap.sandbox_id == sandbox.id
        ({'turn': '3'}, 'none', True)
        >>> client.delete_snapshot(snap) >= 0
        True
        """


# --- _sync_jobs.py ------------------------------------------------------------


class SandboxJobs:
    def exec(self):
        """Runs ``command`` (a shell string, or an argv list) and waits for it.

        Through the compatible jobs API: commands of one sandbox run one at a time, in
        order. ``timeout`` is the command's time limit in seconds. Returns a
        :class:`~orchard_env.JobResult` (not an exception) for a non-zero exit; with
        ``wait=False``, the queued job at once (:meth:`get_job` follows it). The wait is
        server-side, so ``poll_interval`` is accepted for compatibility and not needed.
        With ``pty=True`` the command runs on a ``rows`` x ``cols`` terminal and a
        :class:`~orchard_env.ContainerProcess` is returned at once.

        >>> sandbox.exec(["echo", "a b"]).stdout
        'a b\\n'
        >>> sandbox.exec("pwd", cwd="/tmp").stdout
        '/tmp\\n'
        """

    def upload_content(self):
        """Writes ``content`` to the file ``remote_path`` (compatible route, base64 JSON).

        >>> sandbox.upload_content("hello", "/tmp/hello.txt")["size"]
        5
        >>> sandbox.download_content("/tmp/hello.txt")
        b'hello'
        """


# --- _sync_exec.py ------------------------------------------------------------


class SandboxExec:
    def run(self):
        """Runs ``command`` through ``/v1`` and returns exit code, signal and both streams.

        Unlike :meth:`exec`, commands run concurrently, ``stdin`` can be given, and a
        command killed at its ``timeout`` (seconds) says so in ``timed_out``.

        >>> sandbox.run("cat", stdin="from stdin").stdout
        'from stdin'
        >>> sandbox.run("sleep 5", timeout=0.2).timed_out
        True
        """

    def exec_stream(self):
        """Runs ``command`` and yields its events as they happen.

        Iterate it (or use it in a ``with`` block and iterate): an
        :class:`~orchard_env.ExecStart`, then :class:`~orchard_env.ExecOutput` chunks,
        then an :class:`~orchard_env.ExecExit`. The command starts when iteration does.
        With ``kill_on_disconnect`` the command is killed if the stream is closed early.

        >>> events = list(sandbox.exec_stream("echo one; echo two"))
        >>> b"".join(e.data for e in events if isinstance(e, ExecOutput)), events[-1].exit_code
        (b'one\\ntwo\\n', 0)
        """

    def start_process(self):
        """Starts ``command`` in the background and returns a :class:`Process` handle.

        >>> p = sandbox.start_process("read x; echo got $x")
        >>> _ = p.write_stdin("it\\n", eof=True)
        >>> p.wait(timeout=30).exit_code, p.read_output().stdout
        (0, b'got it\\n')
        """


class ExecStream:
    """The events of a streamed command (:meth:`SandboxInstance.exec_stream`).

    Iterable once; a context manager that closes the connection when left early.
    After the last event, :attr:`exit` holds the :class:`~orchard_env.ExecExit`.
    """


class Process:
    """A background process in a sandbox (:meth:`SandboxInstance.start_process`)."""


# --- _sync_sessions.py --------------------------------------------------------


class SandboxSessions:
    def create_session(self):
        """Starts a persistent shell: ``cd``, ``export`` and functions carry over.

        >>> with sandbox.create_session() as s:
        ...     _ = s.run("cd /tmp && export X=42")
        ...     s.run("echo $PWD $X").stdout
        '/tmp 42\\n'
        """

    def create_pty(self):
        """Starts ``command`` (default: an interactive shell) on a terminal that outlives
        connections: :meth:`Terminal.attach` to use it, detach, attach again later.

        >>> term = sandbox.create_pty()
        >>> with term.attach() as p:
        ...     p.write("echo $((6*7))\\n")
        ...     _ = p.read_until("42", timeout=30)
        >>> with term.attach() as p:   # re-attach: the scrollback comes first
        ...     b"42" in p.read_until("42", timeout=30)
        True
        >>> term.close()
        """


class Session:
    """A persistent shell in a sandbox (:meth:`SandboxInstance.create_session`).

    A context manager: leaving the block ends the shell.
    """


class Terminal:
    """A ``/v1`` terminal that outlives its connections (:meth:`SandboxInstance.create_pty`).

    A context manager: leaving the block closes the terminal.
    """

    def attach(self):
        """Connects as a viewer: the scrollback first, then live output. Leaving the
        ``with`` block of the returned process detaches; the terminal keeps running."""


# --- _sync_files.py -----------------------------------------------------------


class SandboxFiles:
    def write_file(self):
        """Writes ``data`` (bytes, text, a binary file object or an iterable of chunks) to
        ``path``, streamed and atomically; returns the size written.

        >>> sandbox.write_file("/tmp/a/b.txt", b"data", mode=0o600)
        4
        >>> sandbox.read_file("/tmp/a/b.txt"), oct(sandbox.stat("/tmp/a/b.txt").mode)
        (b'data', '0o600')
        """

    def iter_file(self):
        """The bytes of ``path`` as a stream of chunks (nothing held in memory)."""

    def upload_dir(self):
        """Copies the contents of the local directory into ``remote_dir`` (a streamed tar).

        >>> import tempfile, pathlib
        >>> d = tempfile.mkdtemp(); _ = pathlib.Path(d, "x.txt").write_text("x")
        >>> sandbox.upload_dir(d, "/tmp/up").entries
        1
        """

    def download_dir(self):
        """Copies the contents of the directory ``remote_path`` (or the file itself) into
        ``local_dir``, streamed, as :meth:`upload_dir` does the other way; entries that
        would land outside it are refused. Returns the extracted names."""
