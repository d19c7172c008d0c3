"""Walking one schema against another with pyiceberg's `SchemaWithPartnerVisitor`.

Every comparison of two schemas (the config's against a table's, common/schema.py; a registry
writer schema against a table's, decode/registry_decode.py) is a visitor over one
schema whose *partner* at each part is the other schema's field there, found by `ByName`:
fields matched by name inside a struct, a list's element and a map's key and value by
position; None where the other schema has no such part, or a different kind of type there
(the visitor sees the mismatch at the parent, where both are known). `PairVisitor` keeps the
path of the part being visited (names, with `element`, `key` and `value` for the parts of
lists and maps) and does nothing else; a comparison overrides only what it compares.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pyiceberg.schema import PartnerAccessor, Schema, SchemaWithPartnerVisitor, visit_with_partner
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, PrimitiveType, StructType

T = TypeVar("T")
Partner = NestedField  # the other schema's field at this part


def _root(t: IcebergType) -> NestedField:
    return NestedField(0, "", t, required=True)


class ByName(PartnerAccessor[Partner]):
    """The other schema's field at each part: by name in a struct, by position in a list or map."""

    def schema_partner(self, partner: Partner | None) -> Partner | None:
        return partner

    def field_partner(self, partner_struct: Partner | None, field_id: int, field_name: str) -> Partner | None:
        t = partner_struct.field_type if partner_struct is not None else None
        if not isinstance(t, StructType):
            return None
        return next((f for f in t.fields if f.name == field_name), None)

    def list_element_partner(self, partner_list: Partner | None) -> Partner | None:
        t = partner_list.field_type if partner_list is not None else None
        return t.element_field if isinstance(t, ListType) else None

    def map_key_partner(self, partner_map: Partner | None) -> Partner | None:
        t = partner_map.field_type if partner_map is not None else None
        return t.key_field if isinstance(t, MapType) else None

    def map_value_partner(self, partner_map: Partner | None) -> Partner | None:
        t = partner_map.field_type if partner_map is not None else None
        return t.value_field if isinstance(t, MapType) else None


class PairVisitor(SchemaWithPartnerVisitor[Partner, None]):
    """A visit of one schema with the other's fields as partners; `self.path` is the visited
    part's path. Every callback does nothing here."""

    def __init__(self) -> None:
        # (name, whether it is a field's name rather than a list's or map's part)
        self.path: list[tuple[str, bool]] = []

    def before_field(self, field: NestedField, field_partner: Partner | None) -> None:
        self.path.append((field.name, True))

    def after_field(self, field: NestedField, field_partner: Partner | None) -> None:
        self.path.pop()

    def before_list_element(self, element: NestedField, element_partner: Partner | None) -> None:
        self.path.append(("element", False))

    def after_list_element(self, element: NestedField, element_partner: Partner | None) -> None:
        self.path.pop()

    def before_map_key(self, key: NestedField, key_partner: Partner | None) -> None:
        self.path.append(("key", False))

    def after_map_key(self, key: NestedField, key_partner: Partner | None) -> None:
        self.path.pop()

    def before_map_value(self, value: NestedField, value_partner: Partner | None) -> None:
        self.path.append(("value", False))

    def after_map_value(self, value: NestedField, value_partner: Partner | None) -> None:
        self.path.pop()

    def schema(self, schema: Schema, schema_partner: Partner | None, struct_result: None) -> None:
        return None

    def struct(self, struct: StructType, struct_partner: Partner | None, field_results: list[None]) -> None:
        return None

    def field(self, field: NestedField, field_partner: Partner | None, field_result: None) -> None:
        return None

    def list(self, list_type: ListType, list_partner: Partner | None, element_result: None) -> None:
        return None

    def map(self, map_type: MapType, map_partner: Partner | None, key_result: None, value_result: None) -> None:
        return None

    def primitive(self, primitive: PrimitiveType, primitive_partner: Partner | None) -> None:
        return None

    def parts(self) -> tuple[str, ...]:
        """The path with `element`, `key` and `value` for the parts of lists and maps."""
        return tuple(name for name, _ in self.path)

    def names(self) -> str:
        """The path as dotted names: a list element or map value adds no name of its own."""
        return ".".join(name for name, is_field in self.path if is_field)


def walk_pair(visitor: PairVisitor, visited: Schema | IcebergType, other: Schema | IcebergType) -> Any:
    """Visit `visited` with `other`'s fields as partners."""
    partner = _root(other.as_struct() if isinstance(other, Schema) else other)
    start = visited.as_struct() if isinstance(visited, Schema) else visited
    return visit_with_partner(start, partner, visitor, ByName())  # type: ignore[misc]
