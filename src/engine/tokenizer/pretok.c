/*
 * pretok: pre-tokenizer rule sets for byte-level BPE (see pretok.h for why these are hand-written matchers).
 *
 * A split runs a list of rules over a list of pieces (initially the whole text). A rule is either a custom
 * splitter (GPT-2, Llama 3: every codepoint ends up in some word, one by one when nothing matches) or a
 * regex matcher `len = match(view, pos, end)` driven like std::regex_iterator: the leftmost position where
 * the regex matches gives a piece, the text skipped before it gives another. Matchers return 0 for "no
 * match" (none of these regexes can match the empty string).
 *
 * Views of the text, computed once per split:
 *   fl[i]  unicode_flags of codepoint i (custom splitters)
 *   col[i] llama.cpp's collapsed byte: ASCII as is, other white space 0x0B, other codepoints one byte per
 *          category (0xD1 number, 0xD2 letter, 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 the rest)
 *   w[i]   the codepoint, with non-ASCII white space replaced by 0x0B (regexes without \p{..})
 */
#include "engine/tokenizer/pretok.h"

#include "core/err.h"
#include "engine/tokenizer/unicode.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pt_view {
    const uint32_t *cp;
    const uint16_t *fl;
    const uint8_t *col;
    const uint32_t *w;
    const size_t *wsend; /* wsend[i]: first index >= i that is not white space (same set in col and w) */
};

typedef size_t (*pt_match_fn)(const struct pt_view *v, size_t p, size_t end);

/* growable list of piece lengths */
struct pt_vec {
    size_t *v;
    size_t n, cap;
};

static int pt_push(struct pt_vec *a, size_t len)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        size_t *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return ERR_NOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = len;
    return 0;
}

/* ---- character classes of the collapsed view (std::regex over char, "C" locale) ---- */

enum {
    COL_OTHER = 0xD0,
    COL_NUMBER = 0xD1,
    COL_LETTER = 0xD2,
    COL_PUNCT = 0xD3,
    COL_MARK = 0xD4,
    COL_SYMBOL = 0xD5,
};

static bool c_ws(uint8_t c) { return c == ' ' || (c >= 0x09 && c <= 0x0D); }
static bool c_ascii_letter(uint8_t c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static bool c_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static bool c_L(uint8_t c) { return c == COL_LETTER || c_ascii_letter(c); }
static bool c_N(uint8_t c) { return c == COL_NUMBER || c_digit(c); }
static bool c_M(uint8_t c) { return c == COL_MARK; }
/* \p{P} as llama.cpp expands it for the collapsed text: !-# %-* ,-/ :-; ?-@ [-] _ { } */
static bool c_P(uint8_t c)
{
    if (c == COL_PUNCT)
        return true;
    return (c >= '!' && c <= '#') || (c >= '%' && c <= '*') || (c >= ',' && c <= '/') || c == ':' || c == ';' ||
           c == '?' || c == '@' || (c >= '[' && c <= ']') || c == '_' || c == '{' || c == '}';
}
/* \p{S} likewise: $ + < = > ^ ` |  (no '~': llama.cpp's table omits it) */
static bool c_S(uint8_t c)
{
    return c == COL_SYMBOL || c == '$' || c == '+' || (c >= '<' && c <= '>') || c == '^' || c == '`' || c == '|';
}
static bool c_rn(uint8_t c) { return c == '\r' || c == '\n'; }
/* [^\s\p{L}\p{N}] */
static bool c_other(uint8_t c) { return !c_ws(c) && !c_L(c) && !c_N(c); }
/* [^\r\n\p{L}\p{N}] */
static bool c_not_rn_L_N(uint8_t c) { return !c_rn(c) && !c_L(c) && !c_N(c); }

static size_t col_run(const struct pt_view *v, size_t p, size_t end, bool (*pred)(uint8_t))
{
    size_t q = p;
    while (q < end && pred(v->col[q]))
        q++;
    return q - p;
}

/* The white-space tail shared by the Llama-3-like regexes: \s*[\r\n]+ | \s+(?!\S) | \s+ */
static size_t col_ws_tail(const struct pt_view *v, size_t p, size_t end)
{
    size_t r = col_run(v, p, end, c_ws);
    if (r == 0)
        return 0;
    /* \s* backtracks to the last \r or \n of the run, then [\r\n]+ takes it */
    for (size_t j = p + r; j > p; j--)
        if (c_rn(v->col[j - 1]))
            return j - p;
    /* \s+(?!\S): all of the run at the end of the piece, else all but its last char */
    if (p + r == end)
        return r;
    if (r >= 2)
        return r - 1;
    return r; /* \s+ */
}

/* Contractions (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]) on the collapsed view. */
static size_t col_contraction(const struct pt_view *v, size_t p, size_t end)
{
    if (v->col[p] != '\'' || p + 1 >= end)
        return 0;
    uint8_t a = v->col[p + 1] | 0x20; /* ASCII letters only: other bytes never match below */
    if (!c_ascii_letter(v->col[p + 1]))
        return 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (p + 2 < end && c_ascii_letter(v->col[p + 2])) {
        uint8_t b = v->col[p + 2] | 0x20;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return 3;
    }
    return 0;
}

/* ---- regex matchers ---- */

/* [\p{P}\$\+<=>\^~\|]+ */
static bool c_punct_default(uint8_t c)
{
    return c_P(c) || c == '$' || c == '+' || (c >= '<' && c <= '>') || c == '^' || c == '~' || c == '|';
}
static size_t m_punct_default(const struct pt_view *v, size_t p, size_t end)
{
    return col_run(v, p, end, c_punct_default);
}

/* [\p{P}\$\+<=>\^~\|`]+ (falcon) */
static bool c_punct_falcon(uint8_t c) { return c_punct_default(c) || c == '`'; }
static size_t m_punct_falcon(const struct pt_view *v, size_t p, size_t end)
{
    return col_run(v, p, end, c_punct_falcon);
}

/* \p{N}+ */
static size_t m_numbers(const struct pt_view *v, size_t p, size_t end) { return col_run(v, p, end, c_N); }

/* \p{N} */
static size_t m_number(const struct pt_view *v, size_t p, size_t end) { return c_N(v->col[p]) ? 1 : 0; }

/* \p{N}{1,3} */
static size_t m_numbers_1_3(const struct pt_view *v, size_t p, size_t end)
{
    size_t r = col_run(v, p, end, c_N);
    return r > 3 ? 3 : r;
}

/* [0-9][0-9][0-9] */
static size_t m_digits3(const struct pt_view *v, size_t p, size_t end)
{
    if (p + 3 > end)
        return 0;
    for (size_t i = 0; i < 3; i++)
        if (v->w[p + i] < '0' || v->w[p + i] > '9')
            return 0;
    return 3;
}

/* Qwen2: (?:'[sS]|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t m_qwen2(const struct pt_view *v, size_t p, size_t end)
{
    size_t n = col_contraction(v, p, end);
    if (n)
        return n;
    uint8_t c = v->col[p];
    if (c_L(c))
        return col_run(v, p, end, c_L);
    if (c_not_rn_L_N(c) && p + 1 < end && c_L(v->col[p + 1]))
        return 1 + col_run(v, p + 1, end, c_L);
    if (c_N(c))
        return 1;
    size_t q = p;
    if (c == ' ' && p + 1 < end && c_other(v->col[p + 1]))
        q = p + 1;
    if (c_other(v->col[q])) {
        q += col_run(v, q, end, c_other);
        q += col_run(v, q, end, c_rn);
        return q - p;
    }
    return col_ws_tail(v, p, end);
}

/* Tekken: [^\r\n\p{L}\p{N}]?U*W+ | [^\r\n\p{L}\p{N}]?U+W* | \p{N} | ?[^\s\p{L}\p{N}]+[\r\n/]* | ws tail,
 * where U = ((?=\p{L})[^a-z]) and W = ((?=\p{L})[^A-Z]); non-ASCII letters (0xD2) are both. */
static bool c_upperish(uint8_t c) { return c_L(c) && !(c >= 'a' && c <= 'z'); }
static bool c_lowerish(uint8_t c) { return c_L(c) && !(c >= 'A' && c <= 'Z'); }
static bool c_rn_slash(uint8_t c) { return c_rn(c) || c == '/'; }

/* U*W+ at q: U* is greedy and gives back characters until W+ can start. */
static size_t tekken_u_star_w_plus(const struct pt_view *v, size_t q, size_t end)
{
    size_t r = q + col_run(v, q, end, c_upperish);
    for (size_t k = r + 1; k-- > q;) {
        if (k < end && c_lowerish(v->col[k]))
            return (k - q) + col_run(v, k, end, c_lowerish);
    }
    return 0;
}

static size_t tekken_u_plus_w_star(const struct pt_view *v, size_t q, size_t end)
{
    size_t u = col_run(v, q, end, c_upperish);
    if (!u)
        return 0;
    return u + col_run(v, q + u, end, c_lowerish);
}

static size_t m_tekken(const struct pt_view *v, size_t p, size_t end)
{
    uint8_t c = v->col[p];
    bool x = c_not_rn_L_N(c) && p + 1 < end;
    size_t n;
    if (x && (n = tekken_u_star_w_plus(v, p + 1, end)))
        return 1 + n;
    if ((n = tekken_u_star_w_plus(v, p, end)))
        return n;
    if (x && (n = tekken_u_plus_w_star(v, p + 1, end)))
        return 1 + n;
    if ((n = tekken_u_plus_w_star(v, p, end)))
        return n;
    if (c_N(c))
        return 1;
    size_t q = p;
    if (c == ' ' && p + 1 < end && c_other(v->col[p + 1]))
        q = p + 1;
    if (c_other(v->col[q])) {
        q += col_run(v, q, end, c_other);
        q += col_run(v, q, end, c_rn_slash);
        return q - p;
    }
    return col_ws_tail(v, p, end);
}

/* DeepSeek V3: [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
 * ?[\p{P}\p{S}]+[\r\n]* | ws tail */
static bool c_ascii_punct(uint8_t c)
{
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}
static bool c_LM(uint8_t c) { return c_L(c) || c_M(c); }
static bool c_PS(uint8_t c) { return c_P(c) || c_S(c); }

static size_t m_deepseek3(const struct pt_view *v, size_t p, size_t end)
{
    uint8_t c = v->col[p];
    if (c_ascii_punct(c) && p + 1 < end && c_ascii_letter(v->col[p + 1]))
        return 1 + col_run(v, p + 1, end, c_ascii_letter);
    if (!c_rn(c) && !c_L(c) && !c_PS(c) && p + 1 < end && c_LM(v->col[p + 1]))
        return 1 + col_run(v, p + 1, end, c_LM);
    if (c_LM(c))
        return col_run(v, p, end, c_LM);
    size_t q = p;
    if (c == ' ' && p + 1 < end && c_PS(v->col[p + 1]))
        q = p + 1;
    if (c_PS(v->col[q])) {
        q += col_run(v, q, end, c_PS);
        q += col_run(v, q, end, c_rn);
        return q - p;
    }
    return col_ws_tail(v, p, end);
}

/* \s?X+ on the collapsed view */
static size_t col_opt_ws_run(const struct pt_view *v, size_t p, size_t end, bool (*pred)(uint8_t))
{
    if (c_ws(v->col[p]) && p + 1 < end && pred(v->col[p + 1]))
        return 1 + col_run(v, p + 1, end, pred);
    return col_run(v, p, end, pred);
}
static size_t m_ws_letters(const struct pt_view *v, size_t p, size_t end) { return col_opt_ws_run(v, p, end, c_L); }
static size_t m_ws_punct(const struct pt_view *v, size_t p, size_t end) { return col_opt_ws_run(v, p, end, c_P); }

/* ---- matchers over codepoints (regexes without \p{..}: std::wregex in llama.cpp) ---- */

struct cp_range {
    uint32_t lo, hi;
};

static bool w_in(uint32_t c, const struct cp_range *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (c >= r[i].lo && c <= r[i].hi)
            return true;
    return false;
}

static bool w_ws(uint32_t c) { return c == ' ' || (c >= 0x09 && c <= 0x0D); }

static size_t w_run(const struct pt_view *v, size_t p, size_t end, const struct cp_range *r, size_t n)
{
    size_t q = p;
    while (q < end && w_in(v->w[q], r, n))
        q++;
    return q - p;
}

/* \s?[class]+ */
static size_t w_opt_ws_run(const struct pt_view *v, size_t p, size_t end, const struct cp_range *r, size_t n)
{
    if (w_ws(v->w[p]) && p + 1 < end && w_in(v->w[p + 1], r, n))
        return 1 + w_run(v, p + 1, end, r, n);
    return w_run(v, p, end, r, n);
}

#define NRANGES(a) (sizeof(a) / sizeof((a)[0]))

/* [\r\n] */
static size_t m_newline(const struct pt_view *v, size_t p, size_t end)
{
    return (v->w[p] == '\r' || v->w[p] == '\n') ? 1 : 0;
}

/* DeepSeek LLM's letter class (Latin, Greek, Cyrillic, Armenian, Georgian, ... as listed by its tokenizer). */
static const struct cp_range ds_letters[] = {
    {0x0041, 0x005a}, {0x0061, 0x007a}, {0x00b5, 0x00b5}, {0x00c0, 0x00d6}, {0x00d8, 0x00f6},
    {0x00f8, 0x01ba}, {0x01bc, 0x01bf}, {0x01c4, 0x0293}, {0x0295, 0x02af}, {0x0370, 0x0373},
    {0x0376, 0x0377}, {0x037b, 0x037d}, {0x037f, 0x037f}, {0x0386, 0x0386}, {0x0388, 0x038a},
    {0x038c, 0x038c}, {0x038e, 0x03a1}, {0x03a3, 0x03f5}, {0x03f7, 0x0481}, {0x048a, 0x052f},
    {0x0531, 0x0556}, {0x10a0, 0x10c5}, {0x13a0, 0x13f5}, {0x13f8, 0x13fd}, {0x1c90, 0x1cba},
    {0x1cbd, 0x1cbf}, {0x1d00, 0x1d2b}, {0x1d6b, 0x1d77}, {0x1d79, 0x1d9a}, {0x1e00, 0x1f15},
    {0x1f18, 0x1f1d}, {0x1f20, 0x1f45}, {0x1f48, 0x1f4d}, {0x1f50, 0x1f57}, {0x1f59, 0x1f59},
    {0x1f5b, 0x1f5b}, {0x1f5d, 0x1f5d}, {0x1f5f, 0x1f7d}, {0x1f80, 0x1fb4}, {0x1fb6, 0x1fbc},
    {0x1fbe, 0x1fbe}, {0x1fc2, 0x1fc4}, {0x1fc6, 0x1fcc}, {0x1fd0, 0x1fd3}, {0x1fd6, 0x1fdb},
    {0x1fe0, 0x1fec}, {0x1ff2, 0x1ff4}, {0x1ff6, 0x1ffc}, {0x2102, 0x2102}, {0x2107, 0x2107},
    {0x210a, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211d}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212a, 0x212d}, {0x212f, 0x2134}, {0x2139, 0x2139}, {0x213c, 0x213f},
    {0x2145, 0x2149}, {0x214e, 0x214e}, {0x2183, 0x2184}, {0x2c00, 0x2c7b}, {0x2c7e, 0x2ce4},
    {0x2ceb, 0x2cee}, {0x2cf2, 0x2cf3}, {0xa640, 0xa66d}, {0xa680, 0xa69b}, {0xa722, 0xa76f},
    {0xa771, 0xa787}, {0xa78b, 0xa78e}, {0xab70, 0xabbf}, {0xfb00, 0xfb06}, {0xfb13, 0xfb17},
    {0xff21, 0xff3a}, {0xff41, 0xff5a}, {0x10400, 0x1044f}, {0x104b0, 0x104d3}, {0x104d8, 0x104fb},
    {0x10c80, 0x10cb2}, {0x10cc0, 0x10cf2}, {0x118a0, 0x118df}, {0x1e900, 0x1e943},
};
static size_t m_ds_letters(const struct pt_view *v, size_t p, size_t end)
{
    return w_opt_ws_run(v, p, end, ds_letters, NRANGES(ds_letters));
}

/* \s?[!-/:-~！-／：-～‘-‟　-。]+ (U+3000 never matches: it is white space, seen as 0x0B) */
static const struct cp_range ds_punct[] = {
    {0x21, 0x2f}, {0x3a, 0x7e}, {0xff01, 0xff0f}, {0xff1a, 0xff5e}, {0x2018, 0x201f}, {0x3000, 0x3002},
};
static size_t m_ds_punct(const struct pt_view *v, size_t p, size_t end)
{
    return w_opt_ws_run(v, p, end, ds_punct, NRANGES(ds_punct));
}

/* \s+$ */
static size_t m_ws_at_end(const struct pt_view *v, size_t p, size_t end)
{
    /* O(1) through wsend: scanning would make a long non-final run of spaces quadratic */
    size_t q = v->wsend[p] < end ? v->wsend[p] : end;
    return (q > p && q == end) ? q - p : 0;
}

/* [一-龥ࠀ-一가-퟿]+ */
static const struct cp_range ds_cjk[] = {{0x4e00, 0x9fa5}, {0x0800, 0x4e00}, {0xac00, 0xd7ff}};
static size_t m_ds_cjk(const struct pt_view *v, size_t p, size_t end)
{
    return w_run(v, p, end, ds_cjk, NRANGES(ds_cjk));
}

/* [一-龥぀-ゟ゠-ヿ]+ */
static const struct cp_range ds3_cjk[] = {{0x4e00, 0x9fa5}, {0x3040, 0x309f}, {0x30a0, 0x30ff}};
static size_t m_ds3_cjk(const struct pt_view *v, size_t p, size_t end)
{
    return w_run(v, p, end, ds3_cjk, NRANGES(ds3_cjk));
}

/* ?[^(\s|.,!?…。，、।۔،)]+ */
static bool w_poro_word(uint32_t c)
{
    switch (c) {
    case '(': case '|': case '.': case ',': case '!': case '?': case ')':
    case 0x2026: case 0x3002: case 0xff0c: case 0x3001: case 0x0964: case 0x06d4: case 0x060c:
        return false;
    default:
        return !w_ws(c);
    }
}
static size_t m_poro(const struct pt_view *v, size_t p, size_t end)
{
    size_t q = p;
    if (v->w[p] == ' ' && p + 1 < end && w_poro_word(v->w[p + 1]))
        q = p + 1;
    while (q < end && w_poro_word(v->w[q]))
        q++;
    return q - p;
}

/* Chameleon's image/sentinel/whitespace rules. */
static size_t m_cham_sentinel(const struct pt_view *v, size_t p, size_t end)
{
    static const char pre[] = "<sentinel:";
    size_t n = sizeof pre - 1, q = p + n;
    if (q > end)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (v->w[p + i] != (uint8_t)pre[i])
            return 0;
    size_t d = q;
    while (d < end && v->w[d] >= '0' && v->w[d] <= '9')
        d++;
    if (d == q || d >= end || v->w[d] != '>')
        return 0;
    return d + 1 - p;
}

/* (IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z */
static size_t m_cham_image(const struct pt_view *v, size_t p, size_t end)
{
    static const char pre[] = "IMGIMG";
    if (p + 6 > end)
        return 0;
    for (size_t i = 0; i < 6; i++)
        if (v->w[p + i] != (uint8_t)pre[i])
            return 0;
    size_t k = 0;
    while (k < 4 && p + 6 + k < end && v->w[p + 6 + k] >= 'A' && v->w[p + 6 + k] <= 'I')
        k++;
    /* fewer letters cannot help: the next char would be a letter A-I, not Z */
    if (k == 0 || p + 6 + k >= end || v->w[p + 6 + k] != 'Z')
        return 0;
    return 6 + k + 1;
}

/* ([\t\n]|    |  ) */
static size_t m_cham_ws(const struct pt_view *v, size_t p, size_t end)
{
    if (v->w[p] == '\t' || v->w[p] == '\n')
        return 1;
    size_t s = 0;
    while (s < 4 && p + s < end && v->w[p + s] == ' ')
        s++;
    return s == 4 ? 4 : s >= 2 ? 2 : 0;
}

/* [\p{P}!-/:-@\[-`{-~] */
static size_t m_cham_punct(const struct pt_view *v, size_t p, size_t end)
{
    uint8_t c = v->col[p];
    return (c_P(c) || c_ascii_punct(c)) ? 1 : 0;
}

/* ---- llama.cpp's custom splitters (their exact control flow, over Unicode flags) ---- */

#define PT_OOR 0xFFFFFFFFu

struct pt_custom {
    const struct pt_view *v;
    size_t ini, end, prev_end;
    struct pt_vec *out;
    int err;
};

static uint32_t cu_cpt(const struct pt_custom *c, size_t pos)
{
    return (pos >= c->ini && pos < c->end) ? c->v->cp[pos] : PT_OOR;
}

static unsigned cu_flags(const struct pt_custom *c, size_t pos)
{
    return (pos >= c->ini && pos < c->end) ? c->v->fl[pos] : 0;
}

static size_t cu_add(struct pt_custom *c, size_t end)
{
    size_t len = end - c->prev_end;
    if (len > 0 && pt_push(c->out, len))
        c->err = ERR_NOMEM;
    c->prev_end = end;
    return len;
}

#define F_L(f) (((f) & UCAT_LETTER) != 0)
#define F_N(f) (((f) & UCAT_NUMBER) != 0)
#define F_WS(f) (((f) & UFLAG_WHITESPACE) != 0)

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static void pt_split_gpt2(struct pt_custom *c)
{
    for (size_t pos = c->ini; pos < c->end;) {
        uint32_t cpt = cu_cpt(c, pos);
        unsigned flags = cu_flags(c, pos);
        if (cpt == '\'' && pos + 1 < c->end) {
            uint32_t nx = cu_cpt(c, pos + 1);
            if (nx == 's' || nx == 't' || nx == 'm' || nx == 'd') {
                pos += cu_add(c, pos + 2);
                continue;
            }
            if (pos + 2 < c->end) {
                uint32_t nn = cu_cpt(c, pos + 2);
                if ((nx == 'r' && nn == 'e') || (nx == 'v' && nn == 'e') || (nx == 'l' && nn == 'l')) {
                    pos += cu_add(c, pos + 3);
                    continue;
                }
            }
        }
        unsigned f2 = cpt == ' ' ? cu_flags(c, pos + 1) : flags;
        if (F_L(f2)) {
            pos += cpt == ' ';
            while (F_L(f2))
                f2 = cu_flags(c, ++pos);
            cu_add(c, pos);
            continue;
        }
        if (F_N(f2)) {
            pos += cpt == ' ';
            while (F_N(f2))
                f2 = cu_flags(c, ++pos);
            cu_add(c, pos);
            continue;
        }
        if (!(F_WS(f2) || F_L(f2) || F_N(f2)) && f2) {
            pos += cpt == ' ';
            while (!(F_WS(f2) || F_L(f2) || F_N(f2)) && f2)
                f2 = cu_flags(c, ++pos);
            cu_add(c, pos);
            continue;
        }
        size_t nws = 0;
        while (F_WS(cu_flags(c, pos + nws)))
            nws++;
        if (nws > 1 && cu_cpt(c, pos + nws) != PT_OOR) {
            pos += nws - 1;
            cu_add(c, pos);
            continue;
        }
        if (nws > 0) {
            pos += nws;
            cu_add(c, pos);
            continue;
        }
        cu_add(c, ++pos);
    }
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
 * \s+(?!\S)|\s+ */
static void pt_split_llama3(struct pt_custom *c)
{
    for (size_t pos = c->ini; pos < c->end;) {
        uint32_t cpt = cu_cpt(c, pos);
        unsigned flags = cu_flags(c, pos);
        if (cpt == '\'' && pos + 1 < c->end) {
            uint32_t nx = unicode_tolower(cu_cpt(c, pos + 1));
            if (nx == 's' || nx == 't' || nx == 'm' || nx == 'd') {
                pos += cu_add(c, pos + 2);
                continue;
            }
            if (pos + 2 < c->end) {
                uint32_t nn = unicode_tolower(cu_cpt(c, pos + 2));
                if ((nx == 'r' && nn == 'e') || (nx == 'v' && nn == 'e') || (nx == 'l' && nn == 'l')) {
                    pos += cu_add(c, pos + 3);
                    continue;
                }
            }
        }
        if (!(cpt == '\r' || cpt == '\n' || F_N(flags))) {
            if (F_L(flags) || F_L(cu_flags(c, pos + 1))) {
                pos++;
                while (F_L(cu_flags(c, pos)))
                    pos++;
                cu_add(c, pos);
                continue;
            }
        }
        if (F_N(flags)) {
            size_t ini = pos;
            while (F_N(cu_flags(c, pos))) {
                if (++pos - ini >= 3) {
                    cu_add(c, pos);
                    ini = pos;
                }
            }
            cu_add(c, pos);
            continue;
        }
        unsigned f2 = cpt == ' ' ? cu_flags(c, pos + 1) : flags;
        if (!(F_WS(f2) || F_L(f2) || F_N(f2)) && flags) {
            pos += cpt == ' ';
            while (!(F_WS(f2) || F_L(f2) || F_N(f2)) && f2)
                f2 = cu_flags(c, ++pos);
            uint32_t c2 = cu_cpt(c, pos);
            while (c2 == '\r' || c2 == '\n')
                c2 = cu_cpt(c, ++pos);
            cu_add(c, pos);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (F_WS(cu_flags(c, pos + nws))) {
            uint32_t c2 = cu_cpt(c, pos + nws);
            if (c2 == '\r' || c2 == '\n')
                last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) {
            pos = last_rn;
            cu_add(c, pos);
            continue;
        }
        if (nws > 1 && cu_cpt(c, pos + nws) != PT_OOR) {
            pos += nws - 1;
            cu_add(c, pos);
            continue;
        }
        if (nws > 0) {
            pos += nws;
            cu_add(c, pos);
            continue;
        }
        cu_add(c, ++pos);
    }
}

/* ---- rule sets ---- */

enum pt_rule_kind { PT_END, PT_GPT2, PT_LLAMA3, PT_REGEX };

struct pt_rule {
    enum pt_rule_kind kind;
    pt_match_fn fn;
};

#define RX(f) {PT_REGEX, f}
#define MAX_RULES 7

static const struct pt_rule pt_rules[][MAX_RULES] = {
    [PRETOK_DEFAULT] = {RX(m_punct_default), {PT_GPT2, NULL}, RX(m_numbers), RX(m_digits3)},
    [PRETOK_GPT2] = {{PT_GPT2, NULL}},
    [PRETOK_LLAMA3] = {{PT_LLAMA3, NULL}},
    [PRETOK_QWEN2] = {RX(m_qwen2)},
    [PRETOK_DEEPSEEK_LLM] = {RX(m_newline), RX(m_ds_letters), RX(m_ds_punct), RX(m_ws_at_end), RX(m_ds_cjk),
                             RX(m_numbers)},
    [PRETOK_DEEPSEEK_CODER] = {RX(m_newline), RX(m_ws_letters), RX(m_ws_punct), RX(m_ds_cjk), RX(m_number)},
    [PRETOK_DEEPSEEK3] = {RX(m_numbers_1_3), RX(m_ds3_cjk), RX(m_deepseek3)},
    [PRETOK_FALCON] = {RX(m_punct_falcon), {PT_GPT2, NULL}, RX(m_digits3)},
    [PRETOK_STARCODER] = {RX(m_number), {PT_GPT2, NULL}},
    [PRETOK_PORO] = {RX(m_poro)},
    [PRETOK_VIKING] = {RX(m_poro), RX(m_number)},
    [PRETOK_TEKKEN] = {RX(m_tekken)},
    [PRETOK_CHAMELEON] = {RX(m_cham_sentinel), RX(m_cham_image), RX(m_cham_ws), RX(m_number), RX(m_cham_punct),
                          {PT_GPT2, NULL}},
};

static const struct pretok_name pt_names[] = {
    {"default", PRETOK_DEFAULT, 0},
    {"llama3", PRETOK_LLAMA3, PRETOK_F_IGNORE_MERGES | PRETOK_F_ADD_BOS},
    {"llama-v3", PRETOK_LLAMA3, PRETOK_F_IGNORE_MERGES | PRETOK_F_ADD_BOS},
    {"llama-bpe", PRETOK_LLAMA3, PRETOK_F_IGNORE_MERGES | PRETOK_F_ADD_BOS},
    {"falcon3", PRETOK_LLAMA3, PRETOK_F_IGNORE_MERGES | PRETOK_F_ADD_BOS},
    {"dbrx", PRETOK_LLAMA3, 0},
    {"smaug-bpe", PRETOK_LLAMA3, 0},
    {"chatglm-bpe", PRETOK_LLAMA3, PRETOK_F_NO_BOS},
    {"deepseek-llm", PRETOK_DEEPSEEK_LLM, 0},
    {"deepseek-coder", PRETOK_DEEPSEEK_CODER, 0},
    {"deepseek-v3", PRETOK_DEEPSEEK3, 0},
    {"falcon", PRETOK_FALCON, 0},
    {"gpt-2", PRETOK_GPT2, 0},
    {"phi-2", PRETOK_GPT2, 0},
    {"mpt", PRETOK_GPT2, 0},
    {"gpt-neox", PRETOK_GPT2, 0}, /* not a llama.cpp name; an alias some converters write for MPT-style */
    {"olmo", PRETOK_GPT2, 0},
    {"jais", PRETOK_GPT2, 0},
    {"jina-es", PRETOK_GPT2, 0},
    {"jina-de", PRETOK_GPT2, 0},
    {"jina-v1-en", PRETOK_GPT2, 0},
    {"jina-v2-es", PRETOK_GPT2, 0},
    {"jina-v2-de", PRETOK_GPT2, 0},
    {"jina-v2-code", PRETOK_GPT2, 0},
    {"gigachat", PRETOK_GPT2, 0},
    {"roberta-bpe", PRETOK_GPT2, 0},
    {"starcoder", PRETOK_STARCODER, 0},
    {"refact", PRETOK_STARCODER, 0},
    {"command-r", PRETOK_STARCODER, 0},
    {"smollm", PRETOK_STARCODER, 0},
    {"codeshell", PRETOK_STARCODER, 0},
    {"exaone", PRETOK_STARCODER, 0},
    {"minerva-7b", PRETOK_STARCODER, 0},
    {"qwen2", PRETOK_QWEN2, 0},
    {"deepseek-r1-qwen", PRETOK_QWEN2, 0},
    {"stablelm2", PRETOK_QWEN2, 0},
    {"megrez", PRETOK_QWEN2, 0},
    {"poro-chat", PRETOK_PORO, 0},
    {"bloom", PRETOK_PORO, 0},
    {"gpt3-finnish", PRETOK_PORO, 0},
    {"viking", PRETOK_VIKING, 0},
    {"tekken", PRETOK_TEKKEN, PRETOK_F_IGNORE_MERGES | PRETOK_F_ADD_BOS},
    {"chameleon", PRETOK_CHAMELEON, PRETOK_F_ADD_BOS},
};

const struct pretok_name *pretok_lookup(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof pt_names / sizeof pt_names[0]; i++)
        if (strlen(pt_names[i].name) == len && !memcmp(pt_names[i].name, name, len))
            return &pt_names[i];
    return NULL;
}

void pretok_names(char *buf, size_t cap)
{
    size_t o = 0;
    if (cap == 0)
        return;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof pt_names / sizeof pt_names[0]; i++) {
        int w = snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", pt_names[i].name);
        if (w < 0 || (size_t)w >= cap - o)
            return;
        o += (size_t)w;
    }
}

/* Applies one regex matcher to every piece, std::regex_iterator style. */
static int pt_apply_regex(const struct pt_view *v, pt_match_fn fn, const struct pt_vec *in, struct pt_vec *out)
{
    size_t start = 0;
    for (size_t i = 0; i < in->n; i++) {
        size_t end = start + in->v[i], cur = start;
        for (size_t p = start; p < end;) {
            size_t len = fn(v, p, end);
            if (!len) {
                p++;
                continue;
            }
            if (p > cur && pt_push(out, p - cur))
                return ERR_NOMEM;
            if (pt_push(out, len))
                return ERR_NOMEM;
            p += len;
            cur = p;
        }
        if (cur < end && pt_push(out, end - cur))
            return ERR_NOMEM;
        start = end;
    }
    return 0;
}

static int pt_apply_custom(const struct pt_view *v, enum pt_rule_kind kind, const struct pt_vec *in,
                           struct pt_vec *out)
{
    size_t start = 0;
    for (size_t i = 0; i < in->n; i++) {
        struct pt_custom c = {.v = v, .ini = start, .end = start + in->v[i], .prev_end = start, .out = out};
        if (kind == PT_GPT2)
            pt_split_gpt2(&c);
        else
            pt_split_llama3(&c);
        if (c.err)
            return c.err;
        start += in->v[i];
    }
    return 0;
}

static uint8_t pt_collapse(uint32_t cp, unsigned fl)
{
    if (cp < 0x80)
        return (uint8_t)cp;
    if (fl & UFLAG_WHITESPACE)
        return 0x0B;
    switch (fl & UCAT_MASK) {
    case UCAT_NUMBER: return COL_NUMBER;
    case UCAT_LETTER: return COL_LETTER;
    case UCAT_PUNCT: return COL_PUNCT;
    case UCAT_MARK: return COL_MARK;
    case UCAT_SYMBOL: return COL_SYMBOL;
    default: return COL_OTHER;
    }
}

int pretok_split(enum pretok_type type, const uint32_t *cps, size_t n, size_t **lens, size_t *n_words)
{
    int rc = ERR_NOMEM;
    struct pt_vec a = {0}, b = {0};
    uint16_t *fl = NULL;
    uint8_t *col = NULL;
    uint32_t *w = NULL;
    size_t *wsend = NULL;
    *lens = NULL;
    *n_words = 0;
    if (n == 0)
        return 0;
    fl = malloc(n * sizeof *fl);
    col = malloc(n);
    w = malloc(n * sizeof *w);
    wsend = malloc(n * sizeof *wsend);
    if (!fl || !col || !w || !wsend)
        goto done;
    for (size_t i = 0; i < n; i++) {
        unsigned f = unicode_flags(cps[i]);
        fl[i] = (uint16_t)f;
        col[i] = pt_collapse(cps[i], f);
        w[i] = (cps[i] >= 0x80 && (f & UFLAG_WHITESPACE)) ? 0x0B : cps[i];
    }
    for (size_t i = n; i-- > 0;)
        wsend[i] = w_ws(w[i]) ? (i + 1 < n ? wsend[i + 1] : n) : i;
    struct pt_view v = {.cp = cps, .fl = fl, .col = col, .w = w, .wsend = wsend};
    if (pt_push(&a, n))
        goto done;
    for (const struct pt_rule *r = pt_rules[type]; r < pt_rules[type] + MAX_RULES && r->kind != PT_END; r++) {
        b.n = 0;
        rc = r->kind == PT_REGEX ? pt_apply_regex(&v, r->fn, &a, &b) : pt_apply_custom(&v, r->kind, &a, &b);
        if (rc)
            goto done;
        struct pt_vec t = a;
        a = b;
        b = t;
    }
    *lens = a.v;
    *n_words = a.n;
    a.v = NULL;
    rc = 0;
done:
    free(a.v);
    free(b.v);
    free(fl);
    free(col);
    free(w);
    free(wsend);
    return rc;
}
