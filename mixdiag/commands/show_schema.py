"""``mixdiag schema``: print the Timeline data contract (frames, columns, dtypes, units) and the spike record beside it."""


def register(sub, common):
    p = sub.add_parser("schema", parents=[common], help="print the Timeline data contract",
                       description="Print every Timeline frame and column with dtype, unit and meaning.")
    p.set_defaults(func=run)


def run(args, console):
    # pandas: only when the verb runs, not for `mixdiag --help`
    from mixdiag import schema
    from mixdiag.diagnosis import result

    data = {frame: [{"name": c.name, "dtype": c.dtype, "unit": c.unit, "required": c.required,
                     "choices": list(c.choices) if c.choices else None, "doc": c.doc}
                    for c in cols] for frame, cols in schema.FRAMES.items()}
    data["spikes"] = [{"name": c.name, "dtype": c.dtype, "unit": c.unit, "required": c.required,
                       "choices": list(c.choices) if c.choices else None, "doc": c.doc} for c in result.SPIKE_COLUMNS]
    data["evidence"] = [{"name": k, "unit": u, "doc": d} for k, (u, d) in result.EVIDENCE_FIELDS.items()]
    data["schema_version"] = schema.SCHEMA_VERSION
    console.result(schema.describe() + "\n" + result.describe(), data)
    return 0
