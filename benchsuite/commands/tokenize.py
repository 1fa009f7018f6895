"""`benchsuite tokenize FILES -o OUT.bin`: text files → byte-level tokens that train.data can name."""

from __future__ import annotations

from benchsuite.commands.common import JSON, OUTPUT, UsageError, out, output_file, path_arg, print_json
from benchsuite.terminal import printable


def add_parser(sub) -> None:
    tk = sub.add_parser("tokenize", parents=[JSON], help="text files → a .bin of byte-level tokens for train.data")
    tk.add_argument("files", type=path_arg, nargs="+", help="UTF-8 text files; each is one document, followed by EOS")
    tk.add_argument("-o", "--output", type=path_arg, required=True, help=OUTPUT + "the token file to write, e.g. data/train.bin")
    tk.set_defaults(fn=run)


def run(args) -> int:
    from benchsuite.data import tokenize_files

    output_file("-o", args.output, "token file")
    try:
        doc = tokenize_files(args.files, args.output)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print_json(doc)
    else:
        out.print(f"wrote {printable(doc['path'])}: {doc['tokens']:,} tokens from {doc['files']} file(s), "
                  f"byte-level ids (model.vocab >= {doc['vocab_needed']}), sha256 {doc['sha256'][:12]}…; "
                  f'use it with train.data = "{printable(doc["path"])}"', markup=False)
    return 0
