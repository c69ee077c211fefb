"""FAILs explained by hand after reading the implementation: (implementation, format or "*", case) ->
(label, explanation). A FAIL that re-judging explains needs no entry; one listed nowhere is
"unexplained" in the tables, with its reproducer."""

EXPLAINED = {
}
