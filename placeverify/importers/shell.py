"""Reading a launch script: what its commands' words are, as far as the text alone says; never run.

The script is parsed by :mod:`placeverify.importers.shell_syntax` and then read statement by
statement, as bash would run it, on a table of variables:

- ``NAME=word``, ``NAME+=word``, ``NAME=( words )``, ``NAME+=( words )`` (also after ``export``,
  ``declare``, ``local``, ``readonly``) assign; ``unset NAME`` unsets; ``exit`` ends the script.
- ``$NAME``, ``${NAME}``, ``${NAME[@]}``, ``${NAME[*]}``, ``${NAME[i]}``, ``${#NAME}``,
  ``${NAME:-word}`` (``-``, ``:=``, ``=``, ``:+``, ``+``) and ``$(( ))`` over integers expand;
  unquoted results are split into words on blanks and quoted ones are not, as bash does
  (``"${A[@]}"`` gives one word per item).
- Command substitution, backticks and process substitution are never run: their value is
  *unknown*, like a variable the script does not assign (the environment's, an argument
  ``$1``). A variable assigned from an unknown value is assigned but unknown. A word whose value
  is unknown is an error only where the importer needs its value, with the reason.
- ``${NAME:-default}`` for a variable the script does not assign (``$1``, ``$SLURM_NNODES``)
  takes the default and records it as an assumption about the launch.
- ``if``/``elif``/``else`` and ``&&``/``||`` run the branch a test decides when the test is
  static: ``[[ ]]``, ``[ ]`` and ``test`` with ``=``, ``==`` (a pattern in ``[[ ]]``), ``!=``,
  ``-z``, ``-n``, ``-eq``, ``-ne``, ``-lt``, ``-le``, ``-gt``, ``-ge``, ``!``, ``&&``, ``||``,
  ``-a``, ``-o`` and parentheses, over known values; ``true``, ``false`` and ``:``. Any other
  condition is undecided: each branch is read on its own, and afterwards a variable the branches
  leave different is unknown (an error at the test, where the importer needs it), and the items a
  branch appends to an array, or the commands it runs, are given "only if" the test holds.
- ``case`` on a known word runs its arm; on an unknown one it is undecided the same way (with a
  ``*`` arm, one of its arms runs). ``for NAME in WORDS`` over known words and ``while``/``until``
  while their test decides are run (bounded); a loop over the script's arguments runs zero times
  when they are not given (an assumption); any other loop is undecided (run once, or not at all).
- The environment and the arguments given with ``--env`` and ``--script-args``
  (:mod:`placeverify.importers.shell_inputs`) give ``$NAME``, ``$1``, ``$#``, ``"$@"`` and
  ``shift``; their characters stand where the script uses them.
- ``bash -c STRING`` (``sh``; after a launcher such as ``srun ... bash -c "$LAUNCHER $CMD"``)
  reads STRING, once the script has expanded it, as the commands of a child shell: its words
  point at the text they came from; what is not known in the string stays unknown (it is never
  re-read as shell text); the child's assignments do not reach the script.
- ``cat <<EOF > FILE`` (also ``>>``, ``cat > FILE <<EOF``, ``tee FILE <<EOF``) writes FILE: the
  here-document, expanded as bash would, is kept as :attr:`Script.files` under the file's name
  as written (a name with unknown parts, ``./ds_config.$SLURM_JOB_ID.json``, is matched by the
  same text), for an importer that is given that name (``--deepspeed_config``).
- A Slurm batch script's ``#SBATCH --nodes=N`` (``-N N``) header, read before the first command
  as sbatch reads it, gives ``$SLURM_NNODES`` and ``$SLURM_JOB_NUM_NODES`` where the script does
  not assign them, recorded as an assumption (an ``sbatch --nodes`` on the command line wins).
"""

from __future__ import annotations

import bisect
import dataclasses
import fnmatch
import re

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span
from placeverify.importers.shell_inputs import (
    GIVEN,
    NO_INPUTS,
    POSITIONAL,
    Inputs,
    argument,
    not_assigned,
    shifted,
)
from placeverify.importers.shell_patterns import STRIPS, pattern_regex, strip
from placeverify.importers.shell_syntax import (
    NAME,
    AndOr,
    Arith,
    Case,
    Function,
    Group,
    HereDoc,
    If,
    List,
    Lit,
    Loop,
    Node,
    Param,
    Part,
    Pipeline,
    ShellSyntaxError,
    Simple,
    Substitution,
    Test,
    WordTok,
    parse,
    relocate,
)
from placeverify.importers.shell_tests import arithmetic_value, truth
from placeverify.importers.shell_values import (
    BREAK,
    Char,
    Command,
    Doubt,
    Piece,
    Sbatch,
    State,
    Text,
    Unknown,
    Value,
    Word,
    Written,
)

_BLANKS = " \t\n"
_DECLARES = ("export", "declare", "typeset", "local", "readonly")
_MAX_CALLS = 32  # nested function calls read before giving up
_MAX_LOOPS = 256  # a loop's runs read before it is taken as undecided
_MAX_RUNS = 4096  # the runs of all loops of a script (nested loops multiply)
_SHELLS = ("bash", "sh")  # `bash -c STRING` runs STRING in a child shell
_OPAQUE = "\ue000"  # stands for a character whose value is not known while a string is re-read
# an sbatch option on a ``#SBATCH`` line, among others (``#SBATCH --nodes=128 --exclusive
# --ntasks-per-node=8``): a whole number only (``--nodes=2-4`` is a range, not read)
_SBATCH_OPTION = re.compile(r"(?:^|[ \t])(--nodes|-N|--ntasks-per-node|--ntasks|-n)(?:=|[ \t]*)"
                            r"(\d+)(?=[ \t]|$)")
# Slurm's names for each option: sbatch exports them to the job's environment (sbatch(1),
# "OUTPUT ENVIRONMENT VARIABLES")
SBATCH_VARIABLES = {"--nodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
                    "--ntasks-per-node": ("SLURM_NTASKS_PER_NODE",),
                    "--ntasks": ("SLURM_NTASKS", "SLURM_NPROCS")}
_SBATCH_LONG = {"-N": "--nodes", "-n": "--ntasks"}
NAME_SEPARATOR = "\x1f"  # between the characters of a file name with unknown parts




def _error(source: Source, message: str, span: Span, code: Code = Code.NOT_STATIC) -> PlaceError:
    return PlaceError([Diagnostic(Severity.ERROR, message, code, span)], source)


class Script:
    """The commands of a script with their words expanded, as far as the text says."""

    def __init__(self, source: Source, inputs: Inputs = NO_INPUTS) -> None:
        self.source = source
        self.inputs = inputs
        self._starts = [0] + [m.end() for m in re.finditer("\n", source.text)]
        self.commands: list[Command] = []
        self.functions: dict[str, Node] = {}
        self._doubts: list[Doubt] = []
        self.decided: list[str] = []  # defaults taken that decided a test (which branch ran)
        self.sourced: list[Word] = []  # `source FILE` / `. FILE`: files not read
        # redirection targets that read as flags (``<PATH TO DIR> --fp16``: the placeholder's
        # '>' takes --fp16 as its file), with the command's line
        self.swallowed: list[tuple[Word, int]] = []
        self.files: dict[str, Written] = {}  # written from here-documents, by name as written
        self._calls = 0
        self._runs = 0  # loop bodies run (at most _MAX_RUNS)
        self._carried: dict[int, Unknown] = {}  # while re-reading a string: unknown characters
        self._assumed_at: dict[int, str] = {}  # source offsets of values taken as assumptions
        self._via: tuple[Word, ...] = ()  # while a ``bash -c`` string is read: who ran it
        self.sbatch: dict[str, Sbatch] = {}  # ``#SBATCH`` options, by long name
        self.state = State()
        self._sbatch()
        for name, value in inputs.env:
            self.state.values[name] = _given(value)
        if inputs.args is not None:
            self._positional(self.state, inputs.args)
        self.assigned: dict[str, int] = {}  # the offset of each variable's first assignment
        self.expanded: set[str] = set()  # the variables some word expands
        try:
            self._list(parse(source.text), self.state)
        except ShellSyntaxError as error:
            line, column = self.position(error.offset)
            raise _error(source, f"cannot read this script: {error.message}",
                         Span.point(line, column), Code.SYNTAX) from None
        except RecursionError:
            raise _error(source, "cannot read this script: it nests statements too deeply",
                         Span.point(1, 1), Code.TOO_DEEP) from None

    def _sbatch(self) -> None:
        """The ``#SBATCH`` lines before the first command: Slurm's node and task counts
        (``--nodes``/``-N``, ``--ntasks-per-node``, ``--ntasks``/``-n``), whatever other options
        share the line. Each is the value of its ``$SLURM_...`` variables when the job runs
        (unless sbatch's command line says otherwise) and the allocation an ``srun`` in the
        script inherits."""
        offset = 0
        for raw in self.source.text.splitlines(keepends=True):
            line = raw.strip()
            if line and not line.startswith("#"):
                break
            if line.startswith("#SBATCH") and line[7:8] in (" ", "\t"):
                start = offset + raw.index(line)
                options = line.split("#", 2)  # a second '#' starts a comment
                for match in _SBATCH_OPTION.finditer(options[1][6:]):
                    self._sbatch_option(match, start + 7)
            offset += len(raw)

    def _sbatch_option(self, match: re.Match[str], base: int) -> None:
        option = _SBATCH_LONG.get(match.group(1), match.group(1))
        start = base + match.start(2)
        number = match.group(2)
        line = self.line_of(start)
        self.sbatch[option] = Sbatch(option, int(number), self.span(start, start + len(number)))
        names = SBATCH_VARIABLES[option]
        note = (f"${names[0]} = {number}, from #SBATCH at line {line}"
                + (f" (also ${names[1]}" if len(names) > 1 else " (")
                + ("; " if len(names) > 1 else "") + f"an sbatch {option} on the command line "
                "would change it)")
        value = Text(tuple((c, start + k, None) for k, c in enumerate(number)))
        for name in names:
            self.state.values[name] = value
        for k in range(len(number)):
            self._assumed_at[start + k] = note

    # ---- positions ----

    def position(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self._starts, offset)
        return line, offset - self._starts[line - 1] + 1

    def line_of(self, offset: int) -> int:
        return self.position(offset)[0]

    def span(self, start: int, end: int) -> Span:
        line, column = self.position(start)
        last = self.source.text.find("\n", start, end)
        stop = end if last < 0 else last
        return Span(line, column, line, column + max(1, stop - start))

    def _excerpt(self, start: int, end: int) -> str:
        text = " ".join(self.source.text[start:end].split())
        return text if len(text) <= 60 else text[:57] + "..."

    # ---- statements ----

    def _list(self, body: List, state: State) -> bool | str:
        status: bool | str = True
        for item in body.items:
            if state.exited:
                break
            status = self._and_or(item, state)
        return status

    def _and_or(self, item: AndOr, state: State) -> bool | str:
        status = self._pipeline(item.first, state)
        for op, pipeline in item.rest:
            if state.exited:
                break
            runs = status if op == "&&" else (not status if isinstance(status, bool) else status)
            if runs is True:
                status = self._pipeline(pipeline, state)
            elif isinstance(runs, str):
                start = item.first.start
                doubt = Doubt(f"`{self._excerpt(start, pipeline.start)}` (line "
                              f"{self.line_of(start)})", runs, (start, pipeline.start))
                taken = state.copy()
                self._doubts.append(doubt)
                self._pipeline(pipeline, taken)
                self._doubts.pop()
                self._merge(state, [taken, state.copy()], doubt)
                status = runs
        return status

    def _pipeline(self, pipeline: Pipeline, state: State) -> bool | str:
        if len(pipeline.nodes) == 1 and not pipeline.background:
            status = self._node(pipeline.nodes[0], state)
        else:  # each part runs in a subshell: its assignments do not reach the script
            for node in pipeline.nodes:
                status = self._node(node, state.copy())
            status = "the exit status of a pipeline (only running the script gives it)"
        if pipeline.negated and isinstance(status, bool):
            return not status
        return status

    def _node(self, node: Node, state: State) -> bool | str:
        if isinstance(node, Simple):
            return self._simple(node, state)
        if isinstance(node, Test):
            return self._double_bracket(node, state)
        if isinstance(node, If):
            return self._if(node, state)
        if isinstance(node, Case):
            arm = self._case_arm(node, state)
            if not isinstance(arm, str):
                return self._list(arm, state) if arm.items else True
            why = arm
        if isinstance(node, Loop):
            ran = self._loop(node, state)
            if ran is not None:
                return ran
            why = ("placeverify runs a loop over known words only, or while a test it decides "
                   "holds")
        if isinstance(node, Loop | Case):
            kind = f"the {node.kind} loop" if isinstance(node, Loop) else "the case statement"
            doubt = Doubt(f"{kind} at line {self.line_of(node.start)}", why,
                          (node.start, node.start + (len(node.kind) if isinstance(node, Loop) else 4)))
            bodies = [node.body] if isinstance(node, Loop) else [a.body for a in node.arms]
            # a case with a `*` arm runs one of its arms: no path passes it by
            paths = [] if isinstance(node, Case) and any(
                p.literal() == "*" for a in node.arms for p in a.patterns) else [state.copy()]
            self._doubts.append(doubt)
            for body in bodies:
                path = state.copy()
                if isinstance(node, Loop) and node.condition is not None:
                    self._list(node.condition, path)
                self._list(body, path)
                paths.append(path)
            self._doubts.pop()
            self._merge(state, paths, doubt)
            return "the exit status of a loop (only running the script gives it)"
        if isinstance(node, Group):
            if node.subshell:
                inner = state.copy()
                return self._list(node.body, inner)
            return self._list(node.body, state)
        assert isinstance(node, Function)
        self.functions[node.name] = node.body
        return True

    def _loop(self, node: Loop, state: State) -> bool | None:
        """A loop run as bash would, when what it runs over is known: ``for NAME in WORDS``
        once per word, ``while``/``until`` while its test decides (at most _MAX_LOOPS times).
        Without --script-args, a loop over the script's arguments (``for a in "$@"``, ``while
        [[ $# -gt 0 ]]``) runs zero times, said as an assumption. None: undecided."""
        if node.kind in ("for", "while", "until") and (node.kind != "for" or node.variable):
            saved = self._saved()
            trial = state.copy()
            if self._iterate(node, trial):
                state.values, state.exited = trial.values, trial.exited
                return True
            self._restore(saved)
        if self.inputs.args is not None or (node.kind == "for" and not node.variable):
            return None
        saved = self._saved()
        probe = state.copy()
        self._positional(probe, ())
        runs = self._iterate(node, probe, once=True)
        self._restore(saved)
        if runs is not False:
            return None
        self.decided.append(f"no arguments given to the script, so the {node.kind} loop at line "
                            f"{self.line_of(node.start)} runs zero times (--script-args gives "
                            "them)")
        return True

    def _iterate(self, node: Loop, state: State, once: bool = False) -> bool | None:
        """Run the loop on ``state``: True when it ran to its end, None when a test or a word
        is undecided; with ``once``, only whether it runs at all (False: zero times)."""
        if node.kind == "for":
            if node.items is None and "@" not in state.values:
                return None
            words = list(_items(state.values["@"])) if node.items is None else \
                [t for w in node.items for t in self._expand(w, state, split=True)]
            self._runs += len(words)
            if any(t.problem() is not None for t in words) or len(words) > _MAX_LOOPS or \
                    self._runs > _MAX_RUNS:
                return None
            if once:
                return bool(words)
            assert node.variable is not None
            for word in words:
                state.values[node.variable] = word
                self._list(node.body, state)
                if state.exited:
                    break
            return True
        for count in range(_MAX_LOOPS + 1):
            status = self._list(node.condition or List(), state)
            if isinstance(status, str) or state.exited:
                return None if isinstance(status, str) else True
            if status == (node.kind == "until"):
                return not (once and count == 0)
            self._runs += 1
            if once or count == _MAX_LOOPS or self._runs > _MAX_RUNS:
                return None
            self._list(node.body, state)
            if state.exited:
                return True
        return None

    def _saved(self) -> tuple[int, int, int, int, dict[str, Written]]:
        return (len(self.commands), len(self.decided), len(self.sourced), len(self.swallowed),
                dict(self.files))

    def _restore(self, saved: tuple[int, int, int, int, dict[str, Written]]) -> None:
        """Forget what a trial run of a loop found."""
        del self.commands[saved[0]:], self.decided[saved[1]:], self.sourced[saved[2]:]
        del self.swallowed[saved[3]:]
        self.files = saved[4]

    def _positional(self, state: State, args: tuple[str, ...] | tuple[Text, ...]) -> None:
        """The script's arguments: ``$1``... ``$#``, ``$@`` and ``$*``."""
        items = tuple(_given(a) if isinstance(a, str) else a for a in args)
        state.values.update({"@": items, "*": items, "#": _given(str(len(items)))})
        state.values.update({str(k + 1): item for k, item in enumerate(items)})

    def _call(self, name: str, args: list[Text], state: State) -> bool | str:
        """A function's body, run with its own arguments as ``$1``... (bash: the script's are
        back after it returns)."""
        outer = {k: v for k, v in state.values.items() if k in POSITIONAL or k.isdigit()}
        for k in outer:
            del state.values[k]
        self._positional(state, tuple(args))
        self._calls += 1
        status = self._node(self.functions[name], state)
        self._calls -= 1
        for k in [k for k in state.values if k in POSITIONAL or k.isdigit()]:
            del state.values[k]
        state.values.update(outer)
        return status

    def _shift(self, state: State, count: int) -> bool:
        if not shifted(state.values, count):
            return False
        rest = state.values["@"]
        state.values["#"] = _given(str(len(rest) if isinstance(rest, tuple) else 0))
        return True

    def _case_arm(self, node: Case, state: State) -> List | str:
        """The body a ``case`` runs when its subject and patterns are known up to the arm that
        matches (and that arm ends with ``;;``): an empty list when none matches; else why not."""
        subject = self._expand(node.subject, state, split=False)[0]
        problem = subject.problem()
        if problem is not None:
            return problem.reason
        for arm in node.arms:
            for pattern in arm.patterns:
                text = self._expand(pattern, state, split=False)[0]
                problem = text.problem()
                if problem is not None:
                    return problem.reason
                glob = any(isinstance(p, Lit) and not p.quoted and any(c in p.text for c in "*?[")
                           for p in pattern.parts)
                if fnmatch.fnmatchcase(subject.text, text.text) if glob else \
                        subject.text == text.text:
                    return arm.body if arm.end == ";;" else \
                        f"an arm ending with {arm.end} (placeverify reads arms ending with ;;)"
        return List()

    def _if(self, node: If, state: State) -> bool | str:
        paths: list[State] = []
        current = state.copy()
        doubts: list[Doubt] = []
        for condition, body in node.clauses:
            status = self._list(condition, current)
            if status is False:
                continue
            if status is True:
                self._doubts.extend(doubts)
                self._list(body, current)
                del self._doubts[len(self._doubts) - len(doubts):]
                paths.append(current)
                break
            items = condition.items
            start, end = (items[0].first.start, _end(items[-1])) if items else (node.start, node.start)
            doubt = Doubt(f"the test `{self._excerpt(start, end)}` at line {self.line_of(start)}",
                          status, (start, end))
            taken = current.copy()
            doubts.append(doubt)
            self._doubts.extend(doubts)
            self._list(body, taken)
            del self._doubts[len(self._doubts) - len(doubts):]
            paths.append(taken)
        else:
            if node.otherwise is not None:
                self._doubts.extend(doubts)
                self._list(node.otherwise, current)
                del self._doubts[len(self._doubts) - len(doubts):]
            paths.append(current)
        if not doubts:
            state.values, state.exited = paths[-1].values, paths[-1].exited
        else:
            self._merge(state, paths, doubts[0])
        return True

    def _merge(self, state: State, paths: list[State], doubt: Doubt) -> None:
        """The variables after an undecided choice between ``paths``."""
        live = [p for p in paths if not p.exited]
        if not live:
            state.exited = True
            return
        names = {n for p in live for n in p.values}
        merged: dict[str, Value] = {}
        for name in names:
            values = [p.values.get(name) for p in live]
            present = [name in p.values for p in live]
            first = values[0]
            if all(present) and all(_same(v, first) for v in values):
                merged[name] = first
                continue
            arrays = [v if isinstance(v, tuple) else () for v in values]
            if all(isinstance(v, tuple) or v is None or not here
                   for v, here in zip(values, present, strict=True)):
                common = arrays[0]
                for items in arrays[1:]:
                    n = 0
                    while n < min(len(common), len(items)) and common[n].key() == items[n].key():
                        n += 1
                    common = common[:n]
                maybe = doubt.given_only_if()
                agreed, rest = _agreed([items[len(common):] for items in arrays])
                extra = [Text(t.chars, t.whole, t.maybe or maybe, t.assumed)
                         for items in rest for t in items]
                merged[name] = (*common, *agreed, *extra)
            else:
                merged[name] = Text(whole=doubt.unknown(name))
        state.values = merged

    def _simple(self, node: Simple, state: State) -> bool | str:
        line = self.line_of(node.start)
        if not node.words:
            for name, append, value in node.assignments:
                at = self.source.text.find(name, node.start, value.start + 1)
                self._assign(state, name, append, value, line, at)
            return True
        first = node.words[0].literal()
        if first in _DECLARES:
            for word in node.words[1:]:
                assignment = word.assignment()
                if assignment is not None:
                    self._assign(state, *assignment, line, word.start)
            return True
        words = [t for w in node.words for t in self._expand(w, state, split=True)]
        name = words[0].text if words else ""
        if name == "exit":
            state.exited = True
            return False
        if name in ("true", ":"):
            return True
        if name == "false":
            return False
        if name == "shift" and "@" in state.values:
            count = words[1].text if len(words) > 1 else "1"
            return count.isdigit() and self._shift(state, int(count))
        if name == "unset":
            for t in words[1:]:
                if not t.text.startswith("-"):
                    state.values[t.text] = None
            return True
        if name in ("[", "test"):
            args = words[1:]
            if name == "[":
                if not args or args[-1].text != "]":
                    return "a [ without its ] (only running the script would tell)"
                args = args[:-1]
            return self._decided(truth([(t.text, True, t, False) for t in args]), args,
                                 node.start)
        if name in ("source", ".") and len(words) > 1:
            self.sourced.append(self._word(words[1], None))
            return "the exit status of a sourced file (only running the script gives it)"
        if name in self.functions and self._calls < _MAX_CALLS:
            return self._call(name, words[1:], state)
        doubt = self._doubts[0].given_only_if() if self._doubts else None
        self._writes(node, words, state, line, doubt)
        for redirect in node.redirects:
            if isinstance(redirect.target, WordTok) and redirect.op in ("<", ">", ">>", ">|"):
                for target in self._expand(redirect.target, state, split=False):
                    if target.text.startswith("--"):
                        self.swallowed.append((self._word(target, doubt), line))
        shell = _shell_string(words)
        if shell is not None:
            via, string = shell
            outer = self._via
            self._via = (*outer, *(self._word(t, doubt) for t in words[:via]))
            try:
                return self._run_string(string, state, line)
            finally:
                self._via = outer
        out = tuple(self._word(t, doubt) for t in words)
        if out:
            self.commands.append(Command(out, line, self._via))
        return f"the exit status of `{name}` at line {line} (only running the script gives it)"

    def _writes(self, node: Simple, words: list[Text], state: State, line: int,
                doubt: Unknown | None) -> None:
        """``cat <<EOF > FILE`` and ``tee FILE <<EOF``: FILE's text is the here-document's; a file
        any other command writes (``sed ... > FILE``) is written, its text not known."""
        if not words:
            return
        outputs = [(self._expand(r.target, state, split=False)[0], r.op == ">>")
                   for r in node.redirects
                   if r.op in (">", ">>", ">|") and isinstance(r.target, WordTok)]
        docs = [r.target for r in node.redirects if isinstance(r.target, HereDoc)]
        body = docs[-1].body if docs else None
        command = words[0].text.rsplit("/", 1)[-1]
        if command == "tee" and body is not None:
            append = any(w.text in ("-a", "--append") for w in words[1:])
            outputs = [(w, append) for w in words[1:] if not w.text.startswith("-")]
        elif command != "cat" or body is None:
            for target, _ in outputs:
                self.files[_file_name(target)] = Written(Text(), line, doubt,
                                                         by=f"`{words[0].text}`")
            return
        text = self._expand(body, state, split=False)[0]
        for target, append in outputs:
            before = self.files.get(_file_name(target))
            written = Text(before.text.chars + text.chars) if append and before else text
            self.files[_file_name(target)] = Written(written, line, doubt)

    def _run_string(self, string: Text, state: State, line: int) -> str:
        """The commands of ``bash -c STRING``, read in a child shell (its assignments are its
        own). Characters whose value is not known stand as one opaque word part each run, so
        that they are never re-read as shell text, and keep why they are not known."""
        where = [o for _, o, _ in string.chars]
        text = "".join(_OPAQUE if u is not None else c for c, _, u in string.chars)
        fallback = next((o for o in where if o >= 0), 0)
        try:
            tree = parse(text)
        except ShellSyntaxError as error:
            at = where[min(error.offset, len(where) - 1)] if where else -1
            at = at if at >= 0 else fallback
            raise _error(self.source, f"cannot read the commands of this bash -c string: "
                         f"{error.message}", self.span(at, at + 1), Code.SYNTAX) from None
        carried = dict(self._carried)
        self._carried.update({o: u for _, o, u in string.chars if u is not None and o >= 0})
        self._list(relocate(tree, where, fallback), state.copy())
        self._carried = carried
        return f"the exit status of the bash -c at line {line} (only running the script gives it)"

    def _word(self, text: Text, doubt: Unknown | None) -> Word:
        offsets = [o for _, o, _ in text.chars if o >= 0]
        if offsets:
            start = end = offsets[0]
            for o in offsets[1:]:
                if o != end + 1:
                    break
                end = o
            span: Span | None = self.span(start, end + 1)
        else:
            span = None
        maybe = text.maybe or doubt
        unknown = text.problem()
        assumed = tuple(dict.fromkeys([*text.assumed, *(self._assumed_at[o] for _, o, _ in text.chars
                                                        if o in self._assumed_at)]))
        return Word(text.text, span,
                    unknown.reason if unknown else None,
                    self.span(*unknown.at) if unknown and unknown.at else None,
                    maybe.reason if maybe else None,
                    self.span(*maybe.at) if maybe and maybe.at else None,
                    assumed, _file_name(text))

    def _assign(self, state: State, name: str, append: bool, value: WordTok, line: int,
                at: int) -> None:
        if at >= 0 and self.source.text.startswith(name, at):
            self.assigned.setdefault(name, at)
        old = state.values.get(name)
        if value.items is not None:
            items = tuple(t for item in value.items for t in self._expand(item, state, split=True))
            if append:
                before = old if isinstance(old, tuple) else (() if old is None else (old,))
                items = (*before, *items)
            state.values[name] = items
            return
        text = self._join(self._expand(value, state, split=False))
        if append:
            scalar = old[0] if isinstance(old, tuple) and old else old
            base = scalar if isinstance(scalar, Text) else Text()
            text = Text(base.chars + text.chars, base.whole or text.whole, None,
                        base.assumed + text.assumed)
            if isinstance(old, tuple) and old:
                state.values[name] = (text, *old[1:])
                return
        state.values[name] = self._named(text, name, line)

    @staticmethod
    def _named(text: Text, name: str, line: int) -> Text:
        """A value assigned to ``name``: what is not known in it, said of ``$name``."""
        renamed: dict[Unknown, Unknown] = {}

        def rename(u: Unknown | None) -> Unknown | None:
            if u is None or u.at is not None:
                return u
            if u not in renamed:
                head = "the value comes from "
                renamed[u] = Unknown(f"${name} is assigned from {u.reason[len(head):]}"
                                     if u.reason.startswith(head) else
                                     f"${name} (assigned at line {line}) is not known: {u.reason}")
            return renamed[u]

        return Text(tuple((c, o, rename(u)) for c, o, u in text.chars), rename(text.whole),
                    text.maybe, text.assumed)

    @staticmethod
    def _join(texts: list[Text]) -> Text:
        if len(texts) == 1:
            return texts[0]
        chars: list[Char] = []
        for i, t in enumerate(texts):
            if i:
                chars.append((" ", -1, None))
            chars.extend(t.chars)
        return Text(tuple(chars), next((t.whole for t in texts if t.whole), None), None,
                    tuple(a for t in texts for a in t.assumed))

    # ---- expansion ----

    def _expand(self, word: WordTok, state: State, split: bool) -> list[Text]:
        pieces: list[Piece] = []
        for part in word.parts:
            pieces.extend(self._part(part, state))
        return _fields(pieces, split)

    def _part(self, part: Part, state: State) -> list[Piece]:
        if isinstance(part, Lit):
            offsets = part.offsets if len(part.offsets) == len(part.text) else \
                tuple(-1 for _ in part.text)
            # re-reading a bash -c string, an opaque character is the unknown it stands for
            return [Piece(tuple((self.source.text[o], o, self._carried[o])
                                 if c == _OPAQUE and o in self._carried else (c, o, None)
                                 for c, o in zip(part.text, offsets, strict=True)), False)]
        if isinstance(part, Substitution):
            return [self._unknown_piece(part.start, part.end, Unknown(
                f"the value comes from {'a ' + part.kind if part.kind != 'backticks' else 'backticks'}"
                f" at line {self.line_of(part.start)} (only running the script gives it)"))]
        if isinstance(part, Arith):
            return [self._arith(part, state)]
        return self._param(part, state)

    def _unknown_piece(self, start: int, end: int, unknown: Unknown) -> Piece:
        return Piece(tuple((self.source.text[i], i, unknown) for i in range(start, end)), False)

    def _arith(self, part: Arith, state: State) -> Piece:
        problem: list[Unknown] = []
        assumed: list[str] = []

        def value(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2) or match.group(3)
            self.expanded.add(name)
            v = state.values.get(name)
            if isinstance(v, tuple):
                v = v[0] if v else None
            if isinstance(v, Text) and v.problem() is None and re.fullmatch(r"\s*-?\d+\s*", v.text):
                assumed.extend(v.assumed)
                return v.text.strip()
            if isinstance(v, Text) and v.problem() is not None:
                problem.append(v.problem())  # type: ignore[arg-type]
            elif match.group(3) is not None and name not in state.values:
                return "0"  # bash: an unset name in arithmetic is 0
            else:
                problem.append(Unknown(not_assigned(name)))
            return "0"

        expression = part.expression
        if "$(" in expression or "`" in expression:
            return self._unknown_piece(part.start, part.end, Unknown(
                f"the value comes from a command substitution at line {self.line_of(part.start)} "
                "(only running the script gives it)"))
        text = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)|"
                      r"\b([A-Za-z_][A-Za-z0-9_]*)\b", value, expression)
        if problem:
            return self._unknown_piece(part.start, part.end, problem[0])
        result = arithmetic_value(text)
        if result is None:
            return self._unknown_piece(part.start, part.end, Unknown(
                f"the arithmetic $(({expression})) at line {self.line_of(part.start)} is not one "
                "placeverify evaluates (integers with + - * / % and parentheses)"))
        digits = str(result)
        return Piece(tuple((c, part.start + i, None) for i, c in enumerate(digits)), False, None,
                      tuple(dict.fromkeys(assumed)))

    def _param(self, part: Param, state: State) -> list[Piece]:
        """The pieces of ``$NAME`` and the like; a character given on the command line
        (``--env``, ``--script-args``) stands where it is used."""
        self.expanded.add(part.name)
        if part.name in ("@", "*") and part.name in state.values and part.index is None:
            part = dataclasses.replace(part, index=part.name)
        pieces = self._param_pieces(part, state)
        if not any(o == GIVEN for p in pieces for _, o, _ in p.chars):
            return pieces
        last = max(part.start, part.end - 1)
        return [Piece(tuple((c, min(part.start + k, last) if o == GIVEN else o, u)
                             for k, (c, o, u) in enumerate(p.chars)), p.split, p.maybe, p.assumed)
                if any(o == GIVEN for _, o, _ in p.chars) else p for p in pieces]

    def _param_pieces(self, part: Param, state: State) -> list[Piece]:
        name, split = part.name, not part.quoted
        line = self.line_of(part.start)
        # with --script-args, an argument beyond those given is unset, as bash has it
        beyond = self.inputs.args is not None and name.isdigit() and name != "0"
        assigned = name in state.values or beyond
        value = state.values.get(name)
        unset = value is None
        if name in state.values:
            why = f"${name} is unset by the script before line {line}"
        elif (name.isdigit() and name != "0") or name in POSITIONAL:
            why = argument(name)
        elif NAME.fullmatch(name):
            why = not_assigned(name)
        else:
            why = f"${name} is set by the shell when the script runs"
        if part.op == "#len":
            if isinstance(value, tuple) and part.index in ("@", "*"):
                return [Piece(tuple((c, part.start, None) for c in str(len(value))), False)]
            if isinstance(value, Text) and value.problem() is None:
                return [Piece(tuple((c, part.start, None) for c in str(len(value.text))), False)]
            return [self._unknown_piece(part.start, part.end, (
                value.problem() if isinstance(value, Text) else None) or Unknown(why))]
        if part.op == "other":
            return [self._unknown_piece(part.start, part.end, Unknown(
                f"the expansion {self.source.text[part.start:part.end]} at line {line} is not one "
                "placeverify evaluates"))]
        if part.op in STRIPS:
            return self._strip(part, value, state, split, Unknown(why) if unset else None)
        if part.op in (":-", "-", ":=", "=", ":+", "+"):
            colon = part.op.startswith(":")
            empty = unset or (colon and isinstance(value, Text) and value.problem() is None
                              and value.text == "") or (colon and value == ())
            if isinstance(value, Text) and value.whole is not None:
                return [self._unknown_piece(part.start, part.end, value.whole)]
            default = [p for a in part.arg for p in self._part(a, state)]
            default = [Piece(p.chars, p.split and split, p.maybe, p.assumed) for p in default]
            shown = "".join(c for p in default for c, _, _ in p.chars)
            guess = (f"{'$' + name} {'not given' if name.isdigit() else 'unset'} at line {line}, "
                     f"so {self.source.text[part.start:part.end]} is "
                     f"'{shown if part.op.lstrip(':') in '-=' else ''}'") if unset and not assigned \
                else None
            if part.op.lstrip(":") in ("-", "="):
                if not empty:
                    return self._value_pieces(value, part, split)
                pieces = [Piece(p.chars, p.split, p.maybe,
                                 p.assumed + ((guess,) if guess else ())) for p in default] or \
                    [Piece((), False, None, (guess,) if guess else ())]
                if part.op.lstrip(":") == "=":
                    state.values[name] = Text(tuple(c for p in pieces for c in p.chars), None,
                                              None, tuple(a for p in pieces for a in p.assumed))
                return pieces
            # :+ and +: the word when set (and, with ':', not empty)
            if empty:
                return [Piece((), False, None, (guess,) if guess else ())]
            return default
        if unset:
            return [] if beyond else [self._unknown_piece(part.start, part.end, Unknown(why))]
        return self._value_pieces(value, part, split)

    def _strip(self, part: Param, value: Value, state: State, split: bool,
               unset: Unknown | None) -> list[Piece]:
        """``${NAME#pattern}`` and the like (:mod:`.shell_patterns`), when the value and the
        pattern are both known; else unknown at the expansion."""
        line = self.line_of(part.start)
        if unset is not None or isinstance(value, tuple) or value is None:
            why = unset or Unknown(f"the expansion {self.source.text[part.start:part.end]} at "
                                   f"line {line} removes a pattern from an array, which "
                                   "placeverify does not evaluate")
            return [self._unknown_piece(part.start, part.end, why)]
        problem = value.problem()
        if problem is not None:
            return [self._unknown_piece(part.start, part.end, problem)]
        chars: list[tuple[str, bool]] = []
        for arg in part.arg:
            for piece in self._part(arg, state):
                unknown = next((u for _, _, u in piece.chars if u is not None), None)
                if unknown is not None:
                    return [self._unknown_piece(part.start, part.end, unknown)]
                # a quote inside the braces makes the pattern literal; the reader records
                # quoting by context, so inside "${...}" the pattern is a pattern (as in the
                # usual "${arg#*=}"), and only quotes of an unquoted expansion count
                literal = getattr(arg, "quoted", False) and not part.quoted
                chars += [(c, literal) for c, _, _ in piece.chars]
        kept = strip(str(part.op), value.chars, pattern_regex(chars))
        return [Piece(kept, split, value.maybe, value.assumed)]

    def _value_pieces(self, value: Value, part: Param, split: bool) -> list[Piece]:
        if isinstance(value, tuple):
            if part.index in ("@", "*"):
                out: list[Piece] = []
                for i, item in enumerate(value):
                    if i:
                        out.append(BREAK if (split or part.index == "@") else
                                   Piece(((" ", -1, None),), False))
                    out.append(self._text_piece(item, part, split))
                return out
            index = part.index or "0"
            if index.isdigit() and int(index) < len(value):
                return [self._text_piece(value[int(index)], part, split)]
            if index.isdigit():
                return []
            return [self._unknown_piece(part.start, part.end, Unknown(
                f"the index [{index}] at line {self.line_of(part.start)} is not a number"))]
        assert isinstance(value, Text)
        return [self._text_piece(self._here(value, part), part, split)]

    def _here(self, value: Text, part: Param) -> Text:
        """A scalar's value with what is not known in it shown where it is used (``$TP``), so
        that an error about it points at the word that needs it."""
        if value.problem() is None or value.whole is not None:
            return value
        chars: list[Char] = []
        previous: Unknown | None = None
        for char in value.chars:
            if char[2] is None:
                chars.append(char)
            elif char[2] is not previous:
                chars.extend((self.source.text[i], i, char[2]) for i in range(part.start, part.end))
            previous = char[2]
        return Text(tuple(chars), None, value.maybe, value.assumed)

    def _text_piece(self, value: Text, part: Param, split: bool) -> Piece:
        if value.whole is not None:
            piece = self._unknown_piece(part.start, part.end, value.whole)
            return Piece(piece.chars, False, value.maybe, value.assumed)
        return Piece(value.chars, split, value.maybe, value.assumed)

    # ---- [[ ]] ----

    def _double_bracket(self, node: Test, state: State) -> bool | str:
        args: list[tuple[str, bool, Text, bool]] = []
        previous = ""
        for word in node.words:
            literal = word.literal()
            texts = self._expand(word, state, split=False)
            text = texts[0] if texts else Text()
            pattern = previous in ("==", "=", "!=") and any(
                isinstance(p, Lit) and not p.quoted and any(c in p.text for c in "*?[")
                for p in word.parts)
            args.append((text.text, literal is not None, text, pattern))
            previous = literal or ""
        return self._decided(truth(args, arithmetic=True), [a[2] for a in args], node.start)

    def _decided(self, result: bool | str, operands: list[Text], start: int) -> bool | str:
        """A test's result; the defaults its operands took are recorded when it is decided."""
        if isinstance(result, bool):
            line = self.line_of(start)
            for t in operands:
                for a in t.assumed:
                    self.decided.append(f"{a} (deciding the test at line {line})")
        return result


def _agreed(arrays: list[tuple[Text, ...]]) -> tuple[list[Text], list[list[Text]]]:
    """The flags (a ``--flag`` item and the items up to the next) every one of ``arrays``
    gives alike, whatever their order (the first array's), and what each array has besides."""
    def units(items: tuple[Text, ...]) -> list[tuple[Text, ...]]:
        out: list[list[Text]] = []
        for item in items:
            if not out or item.text.startswith("--"):
                out.append([])
            out[-1].append(item)
        return [tuple(u) for u in out]

    def key(unit: tuple[Text, ...]) -> tuple[tuple[str, Unknown | None, Unknown | None], ...]:
        return tuple(t.key() for t in unit)

    each = [units(items) for items in arrays]
    keys = [{key(u) for u in us} for us in each]
    shared = {k for k in keys[0] if all(k in other for other in keys[1:])
              and k and k[0][0].startswith("--")}
    agreed = [t for u in each[0] if key(u) in shared for t in u]
    return agreed, [[t for u in us if key(u) not in shared for t in u] for us in each]


def _items(value: Value) -> tuple[Text, ...]:
    return value if isinstance(value, tuple) else ()


def _given(value: str) -> Text:
    """A value given on the command line: its characters stand where it is used (GIVEN)."""
    return Text(tuple((c, GIVEN, None) for c in value))


def _file_name(text: Text) -> str:
    """How a file is named for :attr:`Script.files`: its text when known; else its known
    characters with where each was written, and a mark for each run not known, so that
    ``./ds_config.$SLURM_JOB_ID.json`` names the same file wherever ``$config_json`` is used."""
    if text.problem() is None:
        return text.text
    out: list[str] = []
    for c, o, u in text.chars:
        if u is None:
            out.append(f"{c}@{o}")
        elif not out or out[-1] != "?":
            out.append("?")
    return NAME_SEPARATOR.join(out)


def _shell_string(words: list[Text]) -> tuple[int, Text] | None:
    """``(k, STRING)`` of ``[launcher ...] bash -c STRING``: STRING is the word after the first
    ``-c`` option (``-c``, ``-lc``, ``-ec``...) given to bash or sh, the shell word k."""
    for k, word in enumerate(words[:-2]):
        if word.problem() is None and word.text.rsplit("/", 1)[-1] in _SHELLS:
            for option in range(k + 1, len(words) - 1):
                flag = words[option].text
                if not flag.startswith("-") or flag.startswith("--"):
                    break
                if "c" in flag[1:]:
                    return k, words[option + 1]
            return None
    return None


def _end(item: AndOr) -> int:
    last = item.rest[-1][1] if item.rest else item.first
    return last.end


def _same(a: Value, b: Value) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(x.key() == y.key() for x, y in zip(a, b, strict=True))
    if isinstance(a, Text) and isinstance(b, Text):
        return a.key() == b.key()
    return a is None and b is None


def _fields(pieces: list[Piece], split: bool) -> list[Text]:
    """Words from expanded pieces: blanks of unquoted expansions split them (with ``split``);
    without ``split`` (an assignment, a ``[[ ]]`` operand) one word, array items joined by a
    space."""
    out: list[Text] = []
    chars: list[Char] = []
    started = False
    maybe: Unknown | None = None
    assumed: list[str] = []

    def emit() -> None:
        nonlocal started, maybe
        if started:
            out.append(Text(tuple(chars), None, maybe, tuple(dict.fromkeys(assumed))))
        chars.clear()
        assumed.clear()
        started, maybe = False, None

    def note(piece: Piece) -> None:
        nonlocal started, maybe
        started = True
        maybe = maybe or piece.maybe
        assumed.extend(piece.assumed)

    for piece in pieces:
        if piece is BREAK:
            if split:
                emit()
            else:
                chars.append((" ", -1, None))
            continue
        if piece.split and split:
            for char in piece.chars:
                if char[0] in _BLANKS and char[2] is None:
                    emit()
                else:
                    chars.append(char)
                    note(piece)
            if not piece.chars:
                assumed.extend(piece.assumed)
        else:
            chars.extend(piece.chars)
            note(piece)
    if not split:
        return [Text(tuple(chars), None, maybe, tuple(dict.fromkeys(assumed)))]
    emit()
    return out
