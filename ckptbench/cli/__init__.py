"""The ``ckptbench`` command line: a click group whose subcommands are imported lazily.

This package is the only place that prints or exits. Domain errors (``CkptbenchError``) and click's
usage errors are caught once here and become one red line on stderr (traceback only with ``-v``).
Exit codes: 0 ok, 1 failed check or runtime failure, 2 bad input, 130 interrupted (Ctrl-C, SIGINT),
143 terminated (SIGTERM). Both signals stop the work the same way: the KeyboardInterrupt unwinds through
every scratch directory's cleanup, then one line says which signal it was; never a traceback. The
first Ctrl-C also says at once that it is cleaning up and that Ctrl-C again exits without: that one
ends the process at once (130), with one line naming what the run may have left behind.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import signal
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from ckptbench import __version__, safeio
from ckptbench.errors import CkptbenchError, ConfigError, SettingError

try:  # the CKPTBENCH_* settings are read once, here, before anything runs: a bad one is the run's one line
    from ckptbench import knobs  # noqa: F401
except SettingError as _bad:
    click.secho(f"ckptbench: error: {_bad}", fg="red", err=True)
    sys.exit(2)

from ckptbench.cli import params  # noqa: E402

#: command name -> "module:attribute"; a command's module is imported only when it runs.
COMMANDS: dict[str, str] = {
    "bench": "ckptbench.cli.bench:bench",
    "clean": "ckptbench.cli.clean:clean",
    "interval": "ckptbench.cli.interval_cmd:interval",
    "goodput": "ckptbench.cli.goodput_cmd:goodput",
    "preflight": "ckptbench.cli.preflight:preflight",
    "compare": "ckptbench.cli.compare:compare",
    "compare-results": "ckptbench.cli.compare_results:compare_results",
    "recommend": "ckptbench.cli.recommend:recommend",
    "report": "ckptbench.cli.report:report",
}


class LazyGroup(click.Group):
    """A group that imports each subcommand's module on first use, so ``interval`` never pays for torch.

    Its ``main`` owns error handling: every ``CkptbenchError`` and click usage error becomes one red
    line on stderr and an exit code (console script, ``python -m ckptbench`` and CliRunner alike).
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        sys.exit(_run(self, argv, prog_name or "ckptbench", extra))

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if _module_exists(COMMANDS[name]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None or not _module_exists(target):
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)


def _module_exists(target: str) -> bool:
    return importlib.util.find_spec(target.split(":")[0]) is not None


def load_config_defaults(path: Path) -> dict[str, Any]:
    """Read a ``--config`` TOML file into click's ``default_map`` (one table per command).

    Keys use the option names with ``-`` or ``_`` (``block-size`` or ``block_size``); values go
    through the same parameter types as the flags, so a bad value fails exactly like a bad flag.
    """
    shown = params.shown_path(path)
    try:
        data = safeio.loads_toml(safeio.read_text(path, safeio.MAX_CONFIG_BYTES, "config file"))
    except FileNotFoundError:
        raise ConfigError(f"config file {shown} does not exist") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {shown} is not valid TOML (not UTF-8 text)") from None
    except OSError as exc:  # a directory, no permission, a name too long
        raise ConfigError(f"config file {shown} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {shown} is not valid TOML: {exc}") from None
    except ValueError as exc:  # a NUL byte in the name (library callers: --config is checked by its type)
        raise ConfigError(f"config file {shown} cannot be read: {exc}") from None
    return config_defaults(data, f"config file {shown}")


def config_defaults(data: dict[str, Any], source: str) -> dict[str, Any]:
    """A parsed config file (``source`` names it in errors) as click's ``default_map``: every table a
    command, every key one of its parameters. The values are converted later by the parameters' own
    types, exactly as flags are; only on/off flags and choices are checked here, as click's BOOL takes strings
    alone and click's Choice (before 8.2) only what it can hash.
    """
    defaults: dict[str, Any] = {}
    for section, table in data.items():
        if section not in COMMANDS:
            raise ConfigError(
                f"{source}: unknown section [{section}]",
                hint=f"sections are command names: {', '.join(sorted(COMMANDS))}",
            )
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        command = LazyGroup().get_command(click.Context(main), section)
        known = {p.name: p for p in command.params} if command else {}
        converted = {}
        for key, value in table.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ConfigError(
                    f"{source}: [{section}] has no setting {key!r}",
                    hint=f"known: {', '.join(sorted(k.replace('_', '-') for k in known))}",
                )
            param = known[name]
            if isinstance(param.type, click.types.BoolParamType) and not isinstance(value, (bool, str)):
                raise ConfigError(f"{source}: [{section}] {key} = {value!r} is not true or false")
            # click < 8.2's Choice raises TypeError on an array or a table (it looks the value up in a dict)
            if isinstance(param.type, click.Choice) and param.nargs == 1 and not param.multiple \
                    and not isinstance(value, str):
                raise ConfigError(f"{source}: [{section}] {key} = {value!r} is not one of "
                                  f"{', '.join(map(repr, param.type.choices))}")
            converted[name] = value
        defaults[section] = converted
    return defaults


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ckptbench")
@click.option("-v", "--verbose", count=True, help="More logging; -v also shows tracebacks on errors.")
@click.option(
    "--config", "config_path", type=params.CONFIG_FILE,
    help="TOML file with defaults per command, e.g. [bench] threads = [1, 2, 4].",
)
@click.pass_context
def main(ctx: click.Context, verbose: int, config_path: Path | None) -> None:
    """ckptbench: measure checkpoint storage with a real checkpoint writer, then decide.

    \b
    ckptbench preflight /mnt/lustre --model llama3-70b --ranks 512
                                       will checkpointing work for this job? PASS/WARN/FAIL/BORDERLINE,
                                       with ranges and the interval to use (no arguments: a default job)
    ckptbench compare /mnt/nvme s3://bucket/ckpt
                                       the same checkpoint on each tier, side by side
    ckptbench recommend --target /mnt/nvme
                                       the writer settings and interval to use, with the evidence
    ckptbench bench /mnt/nvme          throughput of a directory (durable writes, cold reads)
    ckptbench interval --ckpt-time 140s --mtbf 3h
                                       the optimal checkpoint interval
    ckptbench goodput --params 70B ... goodput and wasted cost of a training run

    Each command's --help explains its options; --json gives a result for scripts.
    """
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2),
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Third-party clients log request headers (access key ids, session tokens) at DEBUG: never below INFO.
    for noisy in ("botocore", "boto3", "s3transfer", "urllib3", "s3fs", "aiobotocore", "fsspec"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, logging.WARNING - 10 * min(verbose, 2)))
    ctx.obj = {"verbose": verbose}
    if config_path is not None:
        ctx.default_map = load_config_defaults(config_path)


def _error_line(message: str) -> None:
    click.secho(f"ckptbench: error: {message}", fg="red", err=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that every cleanup on the way out runs."""


#: Said on the first Ctrl-C, as the command starts stopping.
STOPPING_NOTICE = "ckptbench: stopping and cleaning up (press Ctrl-C again to exit at once, without cleaning up)"


class _StopOnSignals:
    """The handlers of SIGINT and SIGTERM while a command runs.

    The first of either stops the command: it raises (KeyboardInterrupt, :class:`Terminated`) in the
    main thread, where ckptbench.interrupts may defer it to a safe point, and every cleanup on the
    way out runs. Meanwhile a SIGTERM changes nothing: it must not cut that cleanup short (a
    supervisor escalates to SIGKILL itself). A Ctrl-C prints :data:`STOPPING_NOTICE` the first time
    and ends the process at once the next: a cleanup can wait on a request that never answers for as
    long as the store retries it (S3: read timeout x attempts, 8 minutes by default; a hard NFS mount:
    forever), and a user pressing Ctrl-C again wants out. Only an exit the user was told of: a Ctrl-C
    after a SIGTERM prints the notice and lets the cleanup go on.

    ``os._exit``, not an exception: ckptbench.interrupts defers a handler's exception until the wait
    it interrupted ends (raised inside it, it broke the wait's locks), but runs the handler at once;
    and an exception that cut the cleanup short would remove files while a worker still writes them,
    then finalize the interpreter under a thread inside the engine (an abort). The process ends, its
    threads with it, without either. Only the command line installs these: a library call never exits
    the process (its second Ctrl-C waits for the cleanup, see ckptbench.interrupts)."""

    def __init__(self) -> None:
        self.stopping = False  # the first signal was raised: the command is on its way out
        self.warned = False  # the notice said what the next Ctrl-C does
        self.first: int | None = None  # the signal that stopped the command

    def on_sigint(self, signum: int, frame: Any) -> None:
        if self.warned:
            _exit_without_cleanup()
        first, self.stopping, self.warned = not self.stopping, True, True  # before printing: one may come meanwhile
        _signal_line(STOPPING_NOTICE, "yellow")
        if first:
            self.first = signal.SIGINT
            raise KeyboardInterrupt

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if not self.stopping:
            self.stopping, self.first = True, signal.SIGTERM
            raise Terminated


def _signal_line(text: str, color: str, *, show_cursor: bool = False) -> None:
    """One line on stderr from a signal handler: straight to the descriptor, as the handler may have
    interrupted a write to ``sys.stderr`` (whose buffer would refuse a reentrant one). On a terminal it
    first clears the line, where a progress bar may be drawn, and is coloured as click would."""
    stream = sys.stderr
    with contextlib.suppress(Exception):
        stream.flush()  # what was printed before comes first
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # no descriptor (click's CliRunner): its own buffer then
        with contextlib.suppress(Exception):
            stream.write(text + "\n")
            stream.flush()
        return
    if os.isatty(fd):
        # the progress bar hides the cursor until it stops: an exit at once must give it back
        text = "\r\x1b[2K" + click.style(text, fg=color) + ("\x1b[?25h" if show_cursor else "")
    with contextlib.suppress(OSError):
        os.write(fd, (text + "\n").encode(getattr(stream, "encoding", None) or "utf-8", "replace"))


def _exit_without_cleanup() -> NoReturn:
    """End the process now (130), saying what this run may have left: the scratch directories and
    prefixes in use (``storage.local.SCRATCH_IN_USE``) and the result file opened in --output before
    the run. Told from what the run recorded and the command's parameters: a handler neither imports
    nor looks at a filesystem (it may be the one hanging)."""
    local = sys.modules.get("ckptbench.storage.local_target")
    left = list(getattr(local, "SCRATCH_IN_USE", ()))
    ctx = click.get_current_context(silent=True)
    output_dir = ctx.params.get("output_dir") if ctx is not None else None
    if output_dir is not None:
        left.append(f"an empty result file in {params.shown_path(output_dir)}")
    line = "ckptbench: error: interrupted again (SIGINT): exited without cleaning up"
    if left:
        listed = left[0] if len(left) == 1 else f"{', '.join(left[:-1])} and {left[-1]}"
        line += f"; this run may have left {listed}"
    with contextlib.suppress(Exception):
        sys.stdout.flush()  # what the command printed is not lost
    _signal_line(line, "red", show_cursor=True)
    os._exit(128 + signal.SIGINT)


@contextmanager
def _stop_on_signals() -> Iterator[_StopOnSignals | None]:
    """:class:`_StopOnSignals`' handlers while the block runs (the main thread only; it gets them, else
    None), the previous ones back after it. An ignored SIGINT stays ignored (a background job: Ctrl-C is
    not meant for it)."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    stop = _StopOnSignals()
    ours = {signal.SIGTERM: stop.on_sigterm, signal.SIGINT: stop.on_sigint}
    previous = {signum: signal.getsignal(signum) for signum in ours}
    if previous[signal.SIGINT] is signal.SIG_IGN:
        del previous[signal.SIGINT]
    try:
        for signum in previous:
            signal.signal(signum, ours[signum])
        yield stop
    finally:
        # signal.signal runs the handlers of pending signals: one that raises must not leave ours behind
        raised = None
        for signum, handler in previous.items():
            try:
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)
            except BaseException as exc:  # noqa: BLE001 - raised below, once every handler is back
                raised = raised or exc
        if raised is not None:
            raise raised


#: click >= 8.2 raises this for a group run without a command (8.1 printed the help and exited 0).
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _run(group: click.Group, args: list[str], prog_name: str, extra: dict[str, Any]) -> int:
    verbose = any(a in ("-v", "--verbose") or (a.startswith("-v") and set(a[1:]) == {"v"}) for a in args)
    stop: _StopOnSignals | None = None
    try:
        with _stop_on_signals() as stop:
            code = click.Group.main(group, args=args, prog_name=prog_name, standalone_mode=False, **extra)
        if isinstance(code, int):  # ctx.exit(N) from a command (e.g. preflight's verdict)
            return code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except _NO_ARGS_IS_HELP as exc:  # `ckptbench` alone asks for the help: not an error
        click.echo(exc.ctx.get_help() if exc.ctx is not None else exc.format_message())
        return 0
    except click.UsageError as exc:
        hint = ""
        if exc.ctx is not None and not isinstance(exc, click.BadParameter):
            hint = f" (see '{exc.ctx.command_path} --help')"
        _error_line(exc.format_message() + hint)
        return 2
    except click.ClickException as exc:
        _error_line(exc.format_message())
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt) as exc:
        # click turns a KeyboardInterrupt into Abort, from it (click < 8.1.4: from None, so the handlers' record
        # says which signal stopped the command)
        raised = exc.__cause__ if isinstance(exc, click.Abort) else exc
        terminated = isinstance(raised, Terminated) or (stop is not None and stop.first == signal.SIGTERM)
        return _stopped_by(signal.SIGTERM if terminated else signal.SIGINT)
    except CkptbenchError as exc:
        if verbose:
            import traceback

            traceback.print_exc()
        _error_line(str(exc))
        return exc.exit_code
    except Exception:
        # After a stop signal, the error the command ends with is the signal's: its handler's exception
        # can come out as another one (raised inside an extension module's import: that import's
        # ImportError, "cannot load module more than once per process"). Otherwise it is a bug, and its
        # traceback is what to report.
        signum = stop.first if stop is not None else None
        if signum is None:
            raise
        if verbose:
            import traceback

            traceback.print_exc()
        return _stopped_by(signum)
    return 0


def _stopped_by(signum: int) -> int:
    """The line a command stopped by ``signum`` (SIGTERM or SIGINT) ends with; its exit status, 128 + it."""
    _error_line("terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted (SIGINT)")
    return 128 + signum
