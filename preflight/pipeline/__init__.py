"""From settings to a Report: what `preflight run` is made of.

settings (+ settings_view, the same file read without pydantic), profiles
(+ profiles/*.toml, and profile_detect, which one `auto` picks), shape (the node's own shape), check (the interface every
check implements), registry (checks from the `preflight.checks` entry
points), plan (settings -> plan -> execute), runner (ordered, fail-fast, with
deadlines), report (+ report_view, the lean reader, report_schema, its field tables,
and report_paths, where the report is), lock, tomlfile.

Imports: preflight.base, preflight.readers, preflight.gpuwork and the
package's __version__; never a check by name, an output or the CLI.
"""
