"""A DataTable that is told *what* rows it should show and changes only what differs.

Refreshing by clearing and re-adding every row makes the cursor jump and the screen flicker. Here
each refresh hands over keyed rows; cells that changed are updated in place, and the rows are
rebuilt only when the set or order of visible rows changes (a GPU appears, the filter or sort
changes), with the cursor put back on the same key. Sorting uses each row's raw values (numbers,
not their formatted text), so `12%` sorts below `100%`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int | None = None


@dataclass(frozen=True)
class Row:
    key: str
    cells: tuple[Any, ...]  # what is shown (str or rich Text)
    values: tuple[Any, ...]  # what sorts and filters (raw numbers, names); same order as the columns


def _sort_key(value: Any) -> tuple:
    # None (a metric not reported) sorts last whichever the direction; numbers before text.
    if value is None:
        return (2, 0)
    if isinstance(value, bool | int | float):
        return (0, value)
    return (1, str(value).lower())


class SyncTable(DataTable):
    """A row-cursor DataTable fed with ``set_rows``; ``filter_text`` and ``sort_by`` reshape it."""

    def __init__(self, columns: Sequence[Column], *, empty: str = "", **kwargs):
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.spec = tuple(columns)
        self.empty_message = empty
        self._rows: dict[str, Row] = {}
        self._shown: list[str] = []
        self.filter_text = ""
        self.sort_column: str | None = None
        self.sort_reverse = False

    def on_mount(self) -> None:
        for col in self.spec:
            # Fixed widths that _sync keeps fitted to the content: DataTable would measure them only
            # when idle, so a first frame (or a snapshot) could show columns as narrow as their labels.
            self.add_column(col.label, key=col.key, width=col.width or cell_len(col.label))
        self._sync()  # rows handed over before the columns existed

    # What to show -------------------------------------------------------------------------------
    def set_rows(self, rows: Sequence[Row]) -> None:
        self._rows = {r.key: r for r in rows}
        self._sync()

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip().lower()
        self._sync()

    def sort_on(self, column: str, reverse: bool | None = None) -> None:
        if reverse is None:
            reverse = not self.sort_reverse if column == self.sort_column else False
        self.sort_column, self.sort_reverse = column, reverse
        self._relabel()
        self._sync()

    def cycle_sort(self) -> str:
        """Sort by the next column (after the last one: back to the natural order)."""
        keys = [c.key for c in self.spec]
        nxt: str | None
        if self.sort_column is None:
            nxt = keys[0]
        else:
            i = keys.index(self.sort_column) + 1
            nxt = keys[i] if i < len(keys) else None
        if nxt is None:
            self.sort_column, self.sort_reverse = None, False
            self._relabel()
            self._sync()
            return "natural order"
        self.sort_on(nxt, reverse=False)
        return self._label(nxt)

    def reverse_sort(self) -> None:
        if self.sort_column is not None:
            self.sort_on(self.sort_column, reverse=not self.sort_reverse)

    @property
    def selected_key(self) -> str | None:
        if not self._shown or self.cursor_row < 0 or self.cursor_row >= len(self._shown):
            return None
        return self._shown[self.cursor_row]

    @property
    def selected(self) -> Row | None:
        key = self.selected_key
        return self._rows.get(key) if key else None

    @property
    def shown_keys(self) -> list[str]:
        return list(self._shown)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_on(str(event.column_key.value))

    # Reconciling --------------------------------------------------------------------------------
    def _visible(self) -> list[str]:
        keys = [k for k, r in self._rows.items() if self._matches(r)]
        if self.sort_column is not None:
            i = [c.key for c in self.spec].index(self.sort_column)
            present = [k for k in keys if self._rows[k].values[i] is not None]
            absent = [k for k in keys if self._rows[k].values[i] is None]
            present.sort(key=lambda k: _sort_key(self._rows[k].values[i]), reverse=self.sort_reverse)
            keys = present + absent
        return keys

    def _matches(self, row: Row) -> bool:
        if not self.filter_text:
            return True
        haystack = " ".join(str(v) for v in (*row.values, *(_plain(c) for c in row.cells)))
        return all(word in haystack.lower() for word in self.filter_text.split())

    def _sync(self) -> None:
        if not self.is_mounted or len(self.columns) != len(self.spec):
            return
        wanted = self._visible()
        if wanted:
            self.border_subtitle = ""
        elif self._rows and self.filter_text:
            self.border_subtitle = f"no row matches the filter {self.filter_text!r}"
        else:
            self.border_subtitle = self.empty_message
        self._fit_columns(wanted)
        if wanted == self._shown:
            for key in wanted:
                row = self._rows[key]
                for col, cell in zip(self.spec, row.cells, strict=True):
                    if _plain(self.get_cell(key, col.key)) != _plain(cell) or self._style_changed(
                        key, col.key, cell
                    ):
                        self.update_cell(key, col.key, cell)
            return
        keep = self.selected_key
        with self.app.batch_update():
            self.clear()
            for key in wanted:
                self.add_row(*self._rows[key].cells, key=key)
            self._shown = wanted
            if keep in wanted:
                self.move_cursor(row=wanted.index(keep), animate=False)

    def _fit_columns(self, keys: list[str]) -> None:
        changed = False
        for i, col in enumerate(self.spec):
            if col.width is not None:
                continue
            label = str(self.columns[ColumnKey(col.key)].label)
            need = max([cell_len(label), *(cell_len(_plain(self._rows[k].cells[i])) for k in keys)])
            column = self.columns[ColumnKey(col.key)]
            if column.width != need:
                column.width = need
                changed = True
        if changed:
            self._require_update_dimensions = True  # DataTable's own flag: recompute the virtual width
            self.refresh(layout=True)

    def _style_changed(self, key: str, column: str, cell: Any) -> bool:
        old = self.get_cell(key, column)
        return isinstance(cell, Text) and (not isinstance(old, Text) or old.spans != cell.spans)

    def _label(self, key: str) -> str:
        return next(c.label for c in self.spec if c.key == key)

    def _relabel(self) -> None:
        for col in self.spec:
            arrow = ""
            if col.key == self.sort_column:
                arrow = " ▼" if self.sort_reverse else " ▲"
            self.columns[ColumnKey(col.key)].label = Text(col.label + arrow)
        self._fit_columns(self._shown)
        self.refresh()


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)
