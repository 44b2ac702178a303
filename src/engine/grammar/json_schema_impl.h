/*
 * json_schema_impl: what the JSON Schema compiler (json_schema.c) and validator (json_schema_validate.c)
 * share, so that both agree on the supported subset: the keyword table, $ref resolution, integer bounds and
 * the GBNF of the string formats (the generator wraps them in quotes, the validator matches decoded strings
 * with them). Internal to src/engine/grammar/.
 */
#ifndef WAFER_ENGINE_JSON_SCHEMA_IMPL_H
#define WAFER_ENGINE_JSON_SCHEMA_IMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define JSON_SCHEMA_MAX_DEPTH 256 /* nested subschemas (and $ref hops while validating one value) */
#define JSON_SCHEMA_INT_MAX 9999999999999999LL /* generated integers have at most 16 digits */

enum json_schema_kw {
    KW_UNKNOWN,
    KW_ANNOTATION, /* title, description, ...: no effect */
    KW_DEFS,       /* $defs, definitions: containers for $ref */
    KW_CORE,       /* type, enum, const, anyOf, oneOf, $ref */
    KW_OBJECT,     /* properties, required, additionalProperties */
    KW_ARRAY,      /* items, prefixItems, additionalItems, minItems, maxItems */
    KW_STRING,     /* minLength, maxLength, pattern, format */
    KW_NUMBER,     /* minimum, maximum, exclusiveMinimum, exclusiveMaximum */
};

enum json_schema_kw json_schema_keyword(const char *k);

/* GBNF rules fmt-date, fmt-uuid, fmt-email and helpers; then fmt-time and fmt-date-time in two variants:
 * what validates, and the subset the generator writes. */
extern const char json_schema_format_rules[];
extern const char json_schema_format_time_valid[];
extern const char json_schema_format_time_generated[];

/* Whether name is one of the supported formats (json_schema_formats in grammar_impl.h). */
bool json_schema_format_known(const char *name);

/* Resolves ref ("#" or "#/json/pointer", ~0 ~1 and %XX unescaped) inside doc. 0, or ERR_UNSUPPORTED (not a
 * local JSON pointer) / ERR_INVALID_ARG (no such location) with a message naming ref and where (at). */
int json_schema_ref(json_t *doc, const char *ref, const char *at, json_t **out, char *err);

/* A non-negative integer keyword value (integer or integral real) in 0..limit; false otherwise. */
bool json_schema_uint(const json_t *v, uint64_t limit, uint64_t *out);

/* Integer bounds of a schema (minimum, maximum, exclusiveMinimum, exclusiveMaximum, draft-04 boolean
 * exclusives) within +-JSON_SCHEMA_INT_MAX (a bound beyond it gives lo > hi). 0, or ERR_INVALID_ARG when a
 * bound is not a number. */
int json_schema_int_bounds(const json_t *schema, int64_t *lo, int64_t *hi, bool *bounded, char *err, const char *at);

/* Validates inst against schema (a node of doc). skip_enum: ignore enum/const on this schema itself (the
 * compiler uses it to keep only the enum values the rest of the schema accepts). 0, ERR_INVALID_ARG
 * (violation), ERR_UNSUPPORTED, ERR_NOMEM; message in err. */
int json_schema_check(json_t *doc, json_t *schema, json_t *inst, bool skip_enum, char *err);

#endif
