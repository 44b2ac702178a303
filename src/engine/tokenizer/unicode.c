/*
 * unicode: category lookup over the generated range table, llama.cpp-compatible UTF-8 decoding, strict
 * UTF-8 stepping for detokenized output, and the GPT-2 byte map. See unicode.h for the contracts.
 */
#include "engine/tokenizer/unicode.h"

/* White_Space from Unicode's PropList.txt (stable since Unicode 6.3; the set llama.cpp uses for \s). */
bool unicode_is_whitespace(uint32_t cp)
{
    if (cp <= 0x20)
        return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85)
        return false;
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

unsigned unicode_flags(uint32_t cp)
{
    if (cp > 0x10FFFF)
        return UCAT_UNDEFINED;
    /* last range whose start <= cp */
    size_t lo = 0, hi = unicode_cat_ranges_n;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((unicode_cat_ranges[mid] >> 8) <= cp)
            lo = mid;
        else
            hi = mid;
    }
    unsigned f = unicode_cat_ranges[lo] & 0xff;
    if (unicode_is_whitespace(cp))
        f |= UFLAG_WHITESPACE;
    return f;
}

uint32_t unicode_tolower(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    size_t lo = 0, hi = unicode_lower_pairs_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (unicode_lower_pairs[mid][0] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < unicode_lower_pairs_n && unicode_lower_pairs[lo][0] == cp) ? unicode_lower_pairs[lo][1] : cp;
}

size_t unicode_len_utf8(unsigned char lead)
{
    static const unsigned char len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[lead >> 4];
}

uint32_t unicode_decode_llama(const unsigned char *s, size_t len, size_t *adv)
{
    unsigned char c = s[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
        *adv = 1;
        return c;
    }
    if (!(c & 0x40))
        goto bad; /* stray continuation byte */
    if (!(c & 0x20)) {
        n = 2;
        cp = c & 0x1f;
    } else if (!(c & 0x10)) {
        n = 3;
        cp = c & 0x0f;
    } else if (!(c & 0x08)) {
        n = 4;
        cp = c & 0x07;
    } else {
        goto bad;
    }
    if (n > len)
        goto bad;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            goto bad;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp > 0x10FFFF)
        goto bad_len;
    *adv = n;
    return cp;
bad_len:
    /* llama.cpp would throw while re-encoding such a value; treat the whole sequence as one bad char */
    *adv = n;
    return UNICODE_REPLACEMENT;
bad:
    *adv = 1;
    return UNICODE_REPLACEMENT;
}

int unicode_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | ((cp >> 18) & 0x07));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Bytes GPT-2 keeps as their own codepoint: printable Latin-1 minus the soft hyphen. The other 68 bytes map,
 * in byte order, to U+0100 upwards. */
static bool unicode_byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t unicode_byte_to_cp(uint8_t b)
{
    if (unicode_byte_is_printable(b))
        return b;
    /* rank of b among the non-printable bytes: 0x00-0x20 (33), 0x7f-0xa0 (34), 0xad (1) */
    if (b <= 0x20)
        return 0x100 + b;
    if (b >= 0x7f && b <= 0xa0)
        return 0x100 + 33 + (b - 0x7f);
    return 0x100 + 67; /* 0xad */
}

int unicode_cp_to_byte(uint32_t cp)
{
    if (cp < 0x100)
        return unicode_byte_is_printable(cp) ? (int)cp : -1;
    if (cp <= 0x100 + 32)
        return (int)(cp - 0x100);
    if (cp <= 0x100 + 66)
        return (int)(cp - 0x100 - 33 + 0x7f);
    if (cp == 0x100 + 67)
        return 0xad;
    return -1;
}

int unicode_utf8_step(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    uint32_t v;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        v = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        v = c & 0x0f;
        if (c == 0xe0)
            lo = 0xa0; /* no overlongs */
        if (c == 0xed)
            hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        v = c & 0x07;
        if (c == 0xf0)
            lo = 0x90;
        if (c == 0xf4)
            hi = 0x8f; /* nothing past U+10FFFF */
    } else {
        return -1;
    }
    for (size_t i = 1; i < n; i++) {
        if (i >= len)
            return 0;
        unsigned char b = s[i];
        unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xbf;
        if (b < l || b > h)
            return -(int)i; /* the bytes so far are one maximal ill-formed subpart */
        v = (v << 6) | (b & 0x3f);
    }
    *cp = v;
    return (int)n;
}

bool unicode_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        uint32_t cp;
        int r = unicode_utf8_step(p + i, len - i, &cp);
        if (r <= 0)
            return false;
        i += (size_t)r;
    }
    return true;
}
