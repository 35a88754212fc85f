"""The checker shared by the tests/python/capture drivers: `check` records a failed
property, `raises` checks that a call refuses with a message containing a text,
`finish` prints the verdict and gives the exit status, `files_of` reads a folder's files."""

import os

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what)


def raises(fn, text, what, errors=(ValueError,)):
    """fn() must raise one of `errors` whose message contains `text`."""
    try:
        fn()
    except errors as e:
        check(text in str(e), f"{what}: message {str(e)!r} lacks {text!r}")
        return
    check(False, f"{what}: no error")


def finish():
    print("FAILED" if FAILS else "all checks passed", len(FAILS))
    return 1 if FAILS else 0


def files_of(folder):
    """{relative path: bytes} of every file under folder."""
    out = {}
    for base, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(base, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = f.read()
    return out
