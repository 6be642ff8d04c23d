"""capplan: capacity planning for LLM serving.

\b
Does the model fit, how fast is a step, what latency under load, which GPUs to buy:
  capplan memory   --model llama-3.1-8b --gpu h100-sxm
  capplan speed    --model llama-3.1-8b --gpu a100-sxm-80gb --batch 1,8,32 --context 1024
  capplan latency  --model llama-3.1-8b --gpu h100-sxm --rate 5 --input-len 1000 --output-len 300
  capplan simulate --model llama-3.1-8b --gpu h100-sxm --rate 5 --requests 2000
  capplan recommend --model llama-3.1-70b --rate 10 --input-len 1000 --output-len 300 \\
                    --ttft-p99 1.0 --tbt-p99 0.06
  capplan plan examples/chat-8b.yaml --export plan.xlsx
"""

from __future__ import annotations

import contextlib
import os
import sys

import click

from capplan import limits as _limits
from capplan.errors import CapplanError, InputError, one_line_error


class UserError(click.ClickException):
    """A one-line error on stderr with exit code 2 (bad input)."""

    exit_code = 2

    def show(self, file=None) -> None:  # noqa: ANN001
        click.echo(f"Error: {self.format_message()}", file=file, err=True)


COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("calibrate_cmd", "Measure step times and fit a calibration file (or benchmark "
                  "a running server)."),
    "gpus": ("catalog_cmds", "List the GPU catalog."),
    "latency": ("latency_cmd", "TTFT / TBT / E2E percentiles and throughput under load "
                "(milliseconds)."),
    "memory": ("memory_cmd", "VRAM per GPU: weights, activations, overhead, paged KV cache, max "
               "concurrency."),
    "models": ("catalog_cmds", "List the model catalog (or `models import CONFIG.json`)."),
    "plan": ("plan_cmds", "Run a YAML plan file: recommendations, pool comparison, exports."),
    "recommend": ("plan_cmds", "GPU type, count and engine settings for a rate and latency SLOs."),
    "schema": ("plan_cmds", "JSON Schema of plan files (point your editor's YAML extension at "
               "it)."),
    "simulate": ("simulate_cmd", "Simulate an engine step by step under a workload: latency, "
                 "throughput, KV use."),
    "speed": ("speed_cmd", "Decode step time and throughput over batch and context; prefill "
              "times."),
    "verify": ("verify_cmd", "Run a plan's workload against a server: predicted vs measured, "
               "side by side."),
}
"""Command -> (module in capplan.cli that registers it, its short help as `--help` lists it).
Modules are imported only for the command that runs, so `capplan --help` and `--version` stay
fast (numpy, scipy and pydantic load with the command that needs them); a test checks the short
help against each command's own."""


ARGS_KEY = "capplan.args"
"""click's context meta key of the arguments capplan was run with (after the program name)."""


class CapplanGroup(click.Group):
    """The ONE place errors are translated into exit codes and one-line messages. Commands load
    lazily (`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:  # noqa: ARG002 - click API
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context,  # noqa: ARG002 - click API
                    cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module = __import__(f"capplan.cli.{COMMANDS[cmd_name][0]}", fromlist=["register"])
            module.register(self)
        return self.commands.get(cmd_name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[ARGS_KEY] = list(args)  # the command line as given (a report repeats it)
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        rows = [(name, click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit)
                 if name in COMMANDS and name not in self.commands
                 else self.commands[name].get_short_help_str(limit)) for name in names]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def load_all(self) -> None:
        """Import every command (for tools that walk `cli.commands`)."""
        for name in COMMANDS:
            self.get_command(click.Context(self), name)

    def invoke(self, ctx: click.Context):  # noqa: ANN201
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except click.UsageError as e:  # click's own bad-input errors: make them one line
            raise UserError(e.format_message().splitlines()[0]) from e
        except InputError as e:
            raise UserError(one_line_error(e)) from e
        except CapplanError as e:
            raise click.ClickException(str(e)) from e
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except RecursionError as e:  # a deeply nested input (YAML, JSON) recursed out
            raise UserError("input nested too deeply to read (a plan or data file nests "
                            "a few levels)") from e
        except MemoryError as e:
            raise UserError("out of memory: the input asks for more work than this machine "
                            "holds; lower the sizes (see docs/reliability.md)") from e
        except UnicodeDecodeError as e:
            raise UserError(f"a file is not UTF-8 text ({e.reason} at byte {e.start}): save it "
                            "as UTF-8") from e
        except BrokenPipeError:  # the reader left (`| head`): nothing is wrong, stop quietly
            # (Python's docs, "Note on SIGPIPE": stdout to devnull so the final flush is quiet)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)  # 128 + SIGPIPE, as a shell reports a command ended by it
        except OSError as e:  # a path the user gave: missing, a folder, not writable
            where = f"{e.filename}: " if getattr(e, "filename", None) else ""
            raise UserError(f"{where}{e.strerror or e}") from e
        except Exception as e:  # noqa: BLE001 - the one place errors become exit codes
            from pydantic import ValidationError

            if isinstance(e, ValidationError):  # options assembled into a model: bad input
                raise UserError(one_line_error(e)) from e
            if os.environ.get("CAPPLAN_DEBUG"):
                raise
            raise click.ClickException(
                f"internal error ({type(e).__name__}: {e}); rerun with CAPPLAN_DEBUG=1 for the "
                "traceback and report it") from e

    def main(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        # click prints usage + error over several lines for UsageError raised while parsing;
        # keep it to one line on stderr, exit 2.
        kwargs.setdefault("standalone_mode", True)
        from capplan.cli._terminal import escaped_output

        with escaped_output(), _warnings_as_notes():  # user input never reaches it raw
            return self._main(*args, **kwargs)

    def _main(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        try:
            return super().main(*args, **{**kwargs, "standalone_mode": False})
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.UsageError as e:
            click.echo(f"Error: {e.format_message().splitlines()[0]}", err=True)
            sys.exit(2)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)


@contextlib.contextmanager
def _warnings_as_notes():  # noqa: ANN202
    """A Python/numpy warning reaches the user as one line without a source path ('note:
    numerical warning ...'); before, `path/to/capplan/models/x.py:629: RuntimeWarning` and the
    source line were printed."""
    import warnings

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001, ARG001
        click.echo(f"note: {category.__name__}: {str(message).splitlines()[0]} (in capplan; "
                   "the result may be affected, please report it)", err=True)

    saved = warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = saved


def _set_limits(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> None:
    from capplan import limits

    limits.reset_caps()
    for item in value:
        try:
            limits.set_cap(item)
        except InputError as e:
            raise click.BadParameter(str(e), ctx, param) from None


@click.group(cls=CapplanGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="capplan")
@click.option("--limit", "limits", multiple=True, metavar="NAME=VALUE", expose_value=False,
              callback=_set_limits, is_eager=True,
              help=f"Raise a work cap ({', '.join(_limits.CAPS)}); see docs/reliability.md.")
def cli() -> None:
    """capplan: which GPUs, how many, with which engine settings, for your LLM traffic.

    \b
    Exit codes:
      0    an answer; an UNSTABLE latency verdict is one too (overload is an answer: the
           output gives the rate one replica sustains instead of latencies)
      1    an internal error (a bug: please report it)
      2    bad input, or SLOs no configuration meets (one line, with the nearest miss)
      130  interrupted (Ctrl-C); 143 terminated (SIGTERM); nothing half-written is left
      141  the output's reader closed it (`| head`); nothing is printed about it
    """


def _terminate(signum: int, _frame: object) -> None:
    # SIGTERM unwinds like Ctrl-C (atomic writes remove their temp file on the way out), and
    # is said as Ctrl-C is ("interrupted"): a killed run's partial output is not a finished one
    print("terminated", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def install_signal_handlers() -> None:
    """SIGTERM exits through SystemExit(143), so `finally`/`except BaseException` blocks run
    (atomic writes delete their temporary file) as they do on Ctrl-C."""
    import signal

    signal.signal(signal.SIGTERM, _terminate)


def main() -> None:
    """The `capplan` program: runs the command and ends the process (`_exit_now`)."""
    install_signal_handlers()
    try:
        cli.main(prog_name="capplan")
    except SystemExit as e:
        code = e.code
    else:
        code = 0
    if code is not None and not isinstance(code, int):  # sys.exit("message"), as Python does
        print(code, file=sys.stderr)
        code = 1
    _exit_now(code or 0)


def _exit_now(code: int) -> None:
    """Exit after the atexit handlers, without the interpreter's teardown: with the compiled
    engine loaded the teardown took 0.2 s of a 1.3 s `latency` answer, and 1.2 s after
    `interrupted` was printed (SIGINT/SIGTERM are to end a run within a second). `finally`
    blocks (temporary files) ran while unwinding; every file is written in a `with` block."""
    import atexit

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    atexit._run_exitfuncs()
    os._exit(code)
