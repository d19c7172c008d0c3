"""The table's schema as the config declares it, and how a table's own schema differs from it.

- :func:`schema_from_config`: `table.schema` (the tree of common/config/types.py) as an Iceberg
  schema, nested structs, lists and maps included, each field with an id.
- :func:`compare`: a path-aware comparison of the config's schema with a table's, at every
  depth. Fields are matched by name inside each struct; a list's element and a map's key and
  value are matched by position. Paths are dotted (`customer.geo.city`); a list element or map
  value adds no name of its own (`items.sku` is a field of the structs in the `items` list).
- :class:`SchemaEvolution` (`streamberg table --evolve`): only what every existing row and
  reader already satisfies: optional fields added at any depth, required fields made optional.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema, SchemaVisitor, visit
from pyiceberg.transforms import parse_transform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from streamberg.common.config import TableConfig
from streamberg.common.config.types import FieldSpec, ListOf, MapOf, Primitive, StructOf, TypeSpec
from streamberg.common.schema_pairs import PairVisitor, walk_pair

_PRIMITIVES: dict[str, IcebergType] = {
    "boolean": BooleanType(), "int": IntegerType(), "long": LongType(), "float": FloatType(),
    "double": DoubleType(), "date": DateType(), "time": TimeType(), "timestamp": TimestampType(),
    "timestamptz": TimestamptzType(), "string": StringType(), "uuid": UUIDType(), "binary": BinaryType(),
}


def iceberg_type(spec: TypeSpec | str, ids: Iterator[int] | None = None) -> IcebergType:
    """The Iceberg type of a config type; nested fields take their ids from `ids`."""
    ids = ids if ids is not None else count(1)
    if isinstance(spec, str):
        spec = Primitive(spec)
    if isinstance(spec, Primitive):
        if spec.name.startswith("decimal"):
            precision, scale = spec.name[spec.name.index("(") + 1 : -1].split(",")
            return DecimalType(int(precision), int(scale))
        return _PRIMITIVES[spec.name]
    if isinstance(spec, StructOf):
        return StructType(*_nested_fields(spec.fields, ids))
    if isinstance(spec, ListOf):
        element_id = next(ids)
        return ListType(element_id, iceberg_type(spec.element, ids), element_required=spec.element_required)
    key_id, value_id = next(ids), next(ids)
    return MapType(key_id, iceberg_type(spec.key, ids), value_id, iceberg_type(spec.value, ids),
                   value_required=spec.value_required)


def _nested_fields(fields: tuple[FieldSpec, ...], ids: Iterator[int]) -> list[NestedField]:
    # A struct's own fields take consecutive ids before any of their children (as Iceberg
    # assigns them), so the top-level columns are 1..n whatever is nested below them.
    own = [next(ids) for _ in fields]
    return [NestedField(field_id=i, name=f.name, field_type=iceberg_type(f.type, ids), required=f.required, doc=f.doc)
            for i, f in zip(own, fields)]


def schema_from_config(table: TableConfig) -> Schema:
    """The declared schema; table.primary_key becomes its identifier fields."""
    fields = _nested_fields(table.field_specs, count(1))
    keys = [next(f.field_id for f in fields if f.name == k) for k in table.primary_key]
    return Schema(*fields, identifier_field_ids=keys)


class _TypeSpecs(SchemaVisitor[TypeSpec]):
    """An Iceberg type as the config's type tree (ids aside)."""

    def schema(self, schema: Schema, struct_result: TypeSpec) -> TypeSpec:
        return struct_result

    def struct(self, struct: StructType, field_results: list[TypeSpec]) -> TypeSpec:
        return StructOf(tuple(FieldSpec(f.name, spec, f.required, f.doc) for f, spec in zip(struct.fields, field_results)))

    def field(self, field: NestedField, field_result: TypeSpec) -> TypeSpec:
        return field_result

    def list(self, list_type: ListType, element_result: TypeSpec) -> TypeSpec:
        return ListOf(element_result, list_type.element_required)

    def map(self, map_type: MapType, key_result: TypeSpec, value_result: TypeSpec) -> TypeSpec:
        return MapOf(key_result, value_result, map_type.value_required)

    def primitive(self, primitive: PrimitiveType) -> TypeSpec:
        if isinstance(primitive, DecimalType):
            return Primitive(f"decimal({primitive.precision},{primitive.scale})")
        return Primitive(str(primitive))


def type_spec(iceberg: IcebergType) -> TypeSpec:
    """An Iceberg type as a config type (the inverse of iceberg_type, ids aside)."""
    return visit(iceberg, _TypeSpecs())


def field_specs(fields: tuple[NestedField, ...]) -> tuple[FieldSpec, ...]:
    """A table's fields as the config's field specs: what a config without `table.schema`
    works from (the table is the truth)."""
    return tuple(FieldSpec(f.name, type_spec(f.field_type), f.required, f.doc) for f in fields)


def field_through_structs(schema: Schema, path: str) -> tuple[NestedField | None, IcebergType | None]:
    """The field a dotted path names through structs (`customer.geo.city`), and what stops
    the walk: (field, None) when found; (None, the list or map on the way) when the path
    leads into one; (None, None) when no field has that name."""
    t: IcebergType = schema.as_struct()
    found = None
    for part in path.split("."):
        if not isinstance(t, StructType):
            return None, t
        found = next((f for f in t.fields if f.name == part), None)
        if found is None:
            return None, None
        t = found.field_type
    return found, None


def partition_name(source: str, transform: str) -> str:
    base = transform.split("[")[0]
    suffix = {"identity": "", "truncate": "_trunc"}.get(base, f"_{base}")
    return f"{source.replace('.', '_')}{suffix}"


def partition_spec_from_config(table: TableConfig, schema: Schema) -> PartitionSpec:
    return PartitionSpec(*[
        PartitionField(source_id=schema.find_field(p.source).field_id, field_id=1000 + i,
                       transform=parse_transform(p.transform), name=partition_name(p.source, p.transform))
        for i, p in enumerate(table.partition_spec)
    ])


# -- comparison ------------------------------------------------------------------------------


@dataclass
class SchemaDiff:
    """How a table's schema (`actual`) differs from the config's (`expected`)."""

    # Fields of the config the table lacks: (the parent's dotted path or "" at the top, the field).
    missing: list[tuple[str, NestedField]] = field(default_factory=list)
    # (path, in the table, in the config)
    type_changes: list[tuple[str, IcebergType, IcebergType]] = field(default_factory=list)
    # Fields required in the table, optional in the config.
    relaxed: list[str] = field(default_factory=list)
    # Lists whose elements, or maps whose values, are required in the table, not in the config:
    # (path, "elements" or "values").
    relaxed_parts: list[tuple[str, str]] = field(default_factory=list)
    # Required in the table, absent from the config.
    required_unnamed: list[str] = field(default_factory=list)


def compare(expected: Schema, actual: Schema) -> SchemaDiff:
    visitor = _ConfigAgainstTable()
    walk_pair(visitor, expected, actual)
    return visitor.diff


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


class _ConfigAgainstTable(PairVisitor):
    """The config's schema visited with the table's fields as partners (common/schema_pairs.py):
    each part compared where both schemas have it, once, at its own level."""

    def __init__(self) -> None:
        super().__init__()
        self.diff = SchemaDiff()

    def struct(self, struct: StructType, struct_partner: NestedField | None, field_results: list[None]) -> None:
        if struct_partner is None:
            return
        have = struct_partner.field_type
        if not isinstance(have, StructType):
            self.diff.type_changes.append((self.names(), have, struct))
            return
        parent = self.names()
        by_name = {f.name: f for f in have.fields}
        for w in struct.fields:
            h = by_name.get(w.name)
            if h is None:
                self.diff.missing.append((parent, w))
            elif h.required and not w.required:
                self.diff.relaxed.append(_join(parent, w.name))
        named = {f.name for f in struct.fields}
        self.diff.required_unnamed.extend(_join(parent, h.name) for h in have.fields
                                          if h.name not in named and h.required)

    def list(self, list_type: ListType, list_partner: NestedField | None, element_result: None) -> None:
        if list_partner is None:
            return
        have = list_partner.field_type
        if not isinstance(have, ListType):
            self.diff.type_changes.append((self.names(), have, list_type))
        elif have.element_required and not list_type.element_required:
            self.diff.relaxed_parts.append((self.names(), "elements"))

    def map(self, map_type: MapType, map_partner: NestedField | None, key_result: None, value_result: None) -> None:
        if map_partner is None:
            return
        have = map_partner.field_type
        if not isinstance(have, MapType):
            self.diff.type_changes.append((self.names(), have, map_type))
            return
        if have.value_required and not map_type.value_required:
            self.diff.relaxed_parts.append((self.names(), "values"))

    def primitive(self, primitive: PrimitiveType, primitive_partner: NestedField | None) -> None:
        if primitive_partner is None:
            return
        have = primitive_partner.field_type
        if have != primitive:
            what = f"{self.names()} (its keys)" if self.path and self.path[-1] == ("key", False) else self.names()
            self.diff.type_changes.append((what, have, primitive))


def describe_schema_differences(expected: Schema, actual: Schema) -> list[str]:
    """What stops records shaped like `expected` from being written to a table with `actual`."""
    diff = compare(expected, actual)
    return ([f"column {_join(parent, f.name)!r} ({f.field_type}) is in the config but not in the table"
             for parent, f in diff.missing]
            + [f"column {path!r} is {have} in the table but {want} in the config" for path, have, want in diff.type_changes]
            + [f"column {path!r} is required in the table but optional in the config" for path in diff.relaxed]
            + [f"the {part} of column {path!r} are required in the table but optional in the config"
               for path, part in diff.relaxed_parts]
            + [f"column {path!r} is required in the table but missing from the config" for path in diff.required_unnamed])


@dataclass(frozen=True)
class SchemaEvolution:
    """What `streamberg table --evolve` changes so the table takes the config's records.

    Only changes every existing row and every reader already satisfies: adding optional
    fields (old rows read them as null), at any depth, and making a required field optional.
    Anything else (a type change, a new required field, a field the config dropped) is refused.
    """

    table: str
    # (the parent's dotted path, "" at the top; the field to add)
    add: tuple[tuple[str, NestedField], ...] = ()
    make_optional: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()

    @property
    def changes(self) -> list[str]:
        return ([f"add optional column {_join(parent, f.name)!r} ({f.field_type})" for parent, f in self.add]
                + [f"make column {name!r} optional" for name in self.make_optional])


def plan_schema_evolution(identifier: str, expected: Schema, actual: Schema) -> SchemaEvolution:
    diff = compare(expected, actual)
    add, refused = [], []
    for parent, f in diff.missing:
        if f.required:
            refused.append(f"column {_join(parent, f.name)!r} ({f.field_type}) is required in the config but not in "
                           "the table: rows already in the table have no value for it; add it as optional")
        else:
            add.append((parent, f))
    refused += [f"column {path!r} is {have} in the table but {want} in the config: type changes are not made by "
                "--evolve" for path, have, want in diff.type_changes]
    refused += [f"the {part} of column {path!r} are required in the table but optional in the config: --evolve "
                "relaxes fields, not list elements or map values" for path, part in diff.relaxed_parts]
    refused += [f"column {path!r} is required in the table but missing from the config: --evolve never drops "
                "or relaxes columns the config does not name" for path in diff.required_unnamed]
    return SchemaEvolution(identifier, tuple(add), tuple(diff.relaxed), tuple(refused))
