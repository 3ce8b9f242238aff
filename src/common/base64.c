/* base64.c — see base64.h. */
#include "base64.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
/* AVX2 is chosen at run time (every x86-64 since 2013 has it, the build's baseline does not):
 * 24 bytes encoded or 32 symbols decoded per step, in the vector forms Wojciech Muła and
 * Daniel Lemire published, against a table lookup per 3 bytes or 4 symbols. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SK_B64_AVX2 1
#endif

static const char alphabet[64] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Symbol values by byte; 255 marks a byte outside the alphabet ('=' is handled before lookup). */
static const uint8_t symbol_value[256] = {
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,  62, 255, 255, 255,  63,
	 52,  53,  54,  55,  56,  57,  58,  59,  60,  61, 255, 255, 255, 255, 255, 255,
	255,   0,   1,   2,   3,   4,   5,   6,   7,   8,   9,  10,  11,  12,  13,  14,
	 15,  16,  17,  18,  19,  20,  21,  22,  23,  24,  25, 255, 255, 255, 255, 255,
	255,  26,  27,  28,  29,  30,  31,  32,  33,  34,  35,  36,  37,  38,  39,  40,
	 41,  42,  43,  44,  45,  46,  47,  48,  49,  50,  51, 255, 255, 255, 255, 255,
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
	255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
};

/* Tables the compiler builds from a formula of the index: ROW256(f, i) is f(i) .. f(i + 255). */
#define ROW4(f, i) f(i), f(i + 1), f(i + 2), f(i + 3)
#define ROW16(f, i) ROW4(f, i), ROW4(f, i + 4), ROW4(f, i + 8), ROW4(f, i + 12)
#define ROW64(f, i) ROW16(f, i), ROW16(f, i + 16), ROW16(f, i + 32), ROW16(f, i + 48)
#define ROW256(f, i) ROW64(f, i), ROW64(f, i + 64), ROW64(f, i + 128), ROW64(f, i + 192)
#define ROW1024(f, i) ROW256(f, i), ROW256(f, i + 256), ROW256(f, i + 512), ROW256(f, i + 768)

/* The symbol for a 6-bit value, as a byte (the alphabet above, as arithmetic). */
#define symbol_of(k) \
	((k) < 26 ? (k) + 65 : (k) < 52 ? (k) + 71 : (k) < 62 ? (k) - 4 : (k) == 62 ? 43 : 47)
/* Both symbols of a 12-bit value: a group encodes with two lookups and two 2-byte copies. */
#define pair(i) { (char)symbol_of((i) >> 6), (char)symbol_of((i) & 63) }
static const char pairs[4096][2] = { ROW1024(pair, 0), ROW1024(pair, 1024), ROW1024(pair, 2048),
				     ROW1024(pair, 3072) };

/* The value of a symbol byte, or -1 for a byte outside the alphabet. */
#define value_of(i) ((i) >= 65 && (i) <= 90 ? (i) - 65 : (i) >= 97 && (i) <= 122 ? (i) - 71 : \
		     (i) >= 48 && (i) <= 57 ? (i) + 4 : (i) == 43 ? 62 : (i) == 47 ? 63 : -1)
/*
 * For little-endian decoding of whole groups: placed[k][b] holds the bits of byte b as the
 * k-th symbol of a group, already where they land in the group's three output bytes read as
 * a little-endian word. A group is then four lookups ORed and one 4-byte store. A byte
 * outside the alphabet sets BAD, in the word's fourth byte, which the next group overwrites.
 */
#define BAD 0x01000000u
#define placed0(i) (value_of(i) < 0 ? BAD : (uint32_t)value_of(i) << 2)
#define placed1(i) \
	(value_of(i) < 0 ? BAD : (uint32_t)value_of(i) >> 4 | ((uint32_t)value_of(i) & 15) << 12)
#define placed2(i) \
	(value_of(i) < 0 ? BAD : ((uint32_t)value_of(i) >> 2) << 8 | ((uint32_t)value_of(i) & 3) << 22)
#define placed3(i) (value_of(i) < 0 ? BAD : (uint32_t)value_of(i) << 16)
static const uint32_t placed[4][256] = { { ROW256(placed0, 0) }, { ROW256(placed1, 0) },
					 { ROW256(placed2, 0) }, { ROW256(placed3, 0) } };

#ifdef SK_B64_AVX2
static int have_avx2(void)
{
	static int known = -1; /* a race here only asks the CPU twice */
	if (known < 0)
		known = __builtin_cpu_supports("avx2") ? 1 : 0;
	return known;
}

/* Whole 24-byte blocks while 28 bytes can be read (each step loads 16 at 0 and 16 at 12);
 * returns the input bytes done, their 4/3 written to out. */
__attribute__((target("avx2"))) static size_t encode_avx2(const unsigned char *in, size_t len,
							 char *out)
{
	size_t i = 0;
	const __m256i spread = _mm256_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10,
						1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
	const __m256i shift_lut = _mm256_setr_epi8('a' - 26, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
		'0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0,
		'a' - 26, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
		'0' - 52, '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0);
	for (; len - i >= 28; i += 24, out += 32) {
		__m128i lo = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
		__m128i hi = _mm_loadu_si128((const __m128i *)(const void *)(in + i + 12));
		__m256i v = _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), spread);
		/* Each 32-bit lane holds 3 bytes; the four 6-bit values go to the four bytes. */
		__m256i t0 = _mm256_mulhi_epu16(_mm256_and_si256(v, _mm256_set1_epi32(0x0fc0fc00)),
						_mm256_set1_epi32(0x04000040));
		__m256i t1 = _mm256_mullo_epi16(_mm256_and_si256(v, _mm256_set1_epi32(0x003f03f0)),
						_mm256_set1_epi32(0x01000010));
		__m256i idx = _mm256_or_si256(t0, t1);
		/* 0-25 → 13, 26-51 → 0, 52-61 → 1-10, 62 → 11, 63 → 12: an offset per class. */
		__m256i cls = _mm256_subs_epu8(idx, _mm256_set1_epi8(51));
		__m256i upper = _mm256_cmpgt_epi8(_mm256_set1_epi8(26), idx);
		cls = _mm256_or_si256(cls, _mm256_and_si256(upper, _mm256_set1_epi8(13)));
		__m256i sym = _mm256_add_epi8(_mm256_shuffle_epi8(shift_lut, cls), idx);
		_mm256_storeu_si256((__m256i *)(void *)out, sym);
	}
	return i;
}

/* Whole 32-symbol blocks while 48 symbols are left (the last group, which may be padded, and
 * room for the 32-byte store of 24 bytes are left to the loops after); stops at a block with a
 * byte outside the alphabet. Returns the symbols done, their 3/4 written to out. */
__attribute__((target("avx2"))) static size_t decode_avx2(const unsigned char *s, size_t len,
							 unsigned char *out)
{
	size_t i = 0;
	const __m256i lut_lo = _mm256_setr_epi8(0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
		0x11, 0x13, 0x1a, 0x1b, 0x1b, 0x1b, 0x1a, 0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
		0x11, 0x11, 0x13, 0x1a, 0x1b, 0x1b, 0x1b, 0x1a);
	const __m256i lut_hi = _mm256_setr_epi8(0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10,
		0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08,
		0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10);
	const __m256i lut_roll = _mm256_setr_epi8(0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0,
		0, 0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0);
	const __m256i mask_2f = _mm256_set1_epi8(0x2f);
	const __m256i pack = _mm256_setr_epi8(2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1,
					      2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1);
	const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7);
	for (; len - i >= 48; i += 32, out += 24) {
		__m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(s + i));
		__m256i hi_nib = _mm256_and_si256(_mm256_srli_epi32(v, 4), mask_2f);
		__m256i lo = _mm256_shuffle_epi8(lut_lo, _mm256_and_si256(v, mask_2f));
		__m256i hi = _mm256_shuffle_epi8(lut_hi, hi_nib);
		/* A symbol's nibble classes share a bit exactly when it is outside the alphabet. */
		if (!_mm256_testz_si256(lo, hi))
			break;
		__m256i eq_2f = _mm256_cmpeq_epi8(v, mask_2f);
		v = _mm256_add_epi8(v, _mm256_shuffle_epi8(lut_roll, _mm256_add_epi8(eq_2f, hi_nib)));
		__m256i ab_cd = _mm256_maddubs_epi16(v, _mm256_set1_epi32(0x01400140));
		__m256i abcd = _mm256_madd_epi16(ab_cd, _mm256_set1_epi32(0x00011000));
		abcd = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(abcd, pack), lanes);
		_mm256_storeu_si256((__m256i *)(void *)out, abcd);
	}
	return i;
}
#endif

void sk_b64_encode(const unsigned char *in, size_t len, char *out)
{
	size_t i = 0;
#ifdef SK_B64_AVX2
	if (have_avx2()) {
		i = encode_avx2(in, len, out);
		out += i / 3 * 4;
	}
#endif
	for (; i + 3 <= len; i += 3) {
		uint32_t v = ((uint32_t)in[i] << 16) | ((uint32_t)in[i + 1] << 8) | in[i + 2];
		memcpy(out, pairs[v >> 12], 2);
		memcpy(out + 2, pairs[v & 4095], 2);
		out += 4;
	}
	if (len - i == 1) {
		uint32_t v = (uint32_t)in[i] << 16;
		*out++ = alphabet[v >> 18];
		*out++ = alphabet[(v >> 12) & 63];
		*out++ = '=';
		*out++ = '=';
	} else if (len - i == 2) {
		uint32_t v = ((uint32_t)in[i] << 16) | ((uint32_t)in[i + 1] << 8);
		*out++ = alphabet[v >> 18];
		*out++ = alphabet[(v >> 12) & 63];
		*out++ = alphabet[(v >> 6) & 63];
		*out++ = '=';
	}
}

int sk_b64_decode(const char *in, size_t len, unsigned char *out, size_t *out_len)
{
	const unsigned char *s = (const unsigned char *)in;
	size_t o = 0, i = 0;

	if (len % 4 != 0) {
		*out_len = len - len % 4;
		return -1;
	}
#ifdef SK_B64_AVX2
	if (have_avx2()) {
		i = decode_avx2(s, len, out);
		o = i / 4 * 3;
	}
#endif
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	/* Two groups at a time while another group follows them, so the fourth byte each store
	 * spills lands where later output goes. A bad symbol stops this loop; the one below finds
	 * and reports it. */
	for (; i + 8 < len; i += 8) {
		uint32_t x = placed[0][s[i]] | placed[1][s[i + 1]] | placed[2][s[i + 2]] |
			     placed[3][s[i + 3]];
		uint32_t y = placed[0][s[i + 4]] | placed[1][s[i + 5]] | placed[2][s[i + 6]] |
			     placed[3][s[i + 7]];
		if ((x | y) & BAD)
			break;
		memcpy(out + o, &x, 4);
		memcpy(out + o + 3, &y, 4);
		o += 6;
	}
#endif
	/* Every group but the last has no padding: decode those without per-symbol branching. */
	for (; len >= 4 && i < len - 4; i += 4) {
		uint8_t a = symbol_value[s[i]], b = symbol_value[s[i + 1]];
		uint8_t c = symbol_value[s[i + 2]], d = symbol_value[s[i + 3]];
		if ((a | b | c | d) & 0x80) {
			size_t k = i;
			while (symbol_value[s[k]] != 255)
				k++;
			*out_len = k;
			return -1;
		}
		uint32_t v = ((uint32_t)a << 18) | ((uint32_t)b << 12) | ((uint32_t)c << 6) | d;
		out[o++] = (unsigned char)(v >> 16);
		out[o++] = (unsigned char)(v >> 8);
		out[o++] = (unsigned char)v;
	}
	if (len > 0) {
		uint8_t a = symbol_value[s[i]], b = symbol_value[s[i + 1]];
		int pad = (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=');
		uint8_t c = pad == 2 ? 0 : symbol_value[s[i + 2]];
		uint8_t d = pad >= 1 ? 0 : symbol_value[s[i + 3]];
		if ((a | b | c | d) & 0x80) {
			*out_len = i + ((a & 0x80) ? 0 : (b & 0x80) ? 1 : (c & 0x80) ? 2 : 3);
			return -1;
		}
		/* The bits a shorter group leaves unused must be zero, or two inputs decode alike. */
		if ((pad == 2 && (b & 0x0f)) || (pad == 1 && (c & 0x03))) {
			*out_len = i + 3 - pad;
			return -1;
		}
		uint32_t v = ((uint32_t)a << 18) | ((uint32_t)b << 12) | ((uint32_t)c << 6) | d;
		out[o++] = (unsigned char)(v >> 16);
		if (pad < 2)
			out[o++] = (unsigned char)(v >> 8);
		if (pad < 1)
			out[o++] = (unsigned char)v;
	}
	*out_len = o;
	return 0;
}

/*
 * How many of the len bytes at s, from the first, are symbols of the alphabet ('=' is not).
 * A relay checks every payload byte here, so with SSE2 (every x86-64) sixteen bytes are
 * tested at once: a byte is a symbol when it lies in one of 'A'-'Z', 'a'-'z', '/'-'9' (which
 * is '/' and the digits) or is '+'; the signed compares put bytes of 0x80 and up outside all
 * of them. A block with any other byte is left to the table, which finds the exact one.
 */
static size_t symbol_run(const unsigned char *s, size_t len)
{
	size_t i = 0;
#if defined(__SSE2__)
	const __m128i upper_lo = _mm_set1_epi8('A' - 1), upper_hi = _mm_set1_epi8('Z' + 1);
	const __m128i lower_lo = _mm_set1_epi8('a' - 1), lower_hi = _mm_set1_epi8('z' + 1);
	const __m128i digit_lo = _mm_set1_epi8('/' - 1), digit_hi = _mm_set1_epi8('9' + 1);
	const __m128i plus = _mm_set1_epi8('+');
	for (; len - i >= 16; i += 16) {
		__m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
		__m128i upper = _mm_and_si128(_mm_cmpgt_epi8(x, upper_lo), _mm_cmplt_epi8(x, upper_hi));
		__m128i lower = _mm_and_si128(_mm_cmpgt_epi8(x, lower_lo), _mm_cmplt_epi8(x, lower_hi));
		__m128i digit = _mm_and_si128(_mm_cmpgt_epi8(x, digit_lo), _mm_cmplt_epi8(x, digit_hi));
		__m128i symbol = _mm_or_si128(_mm_or_si128(upper, lower),
					      _mm_or_si128(digit, _mm_cmpeq_epi8(x, plus)));
		if (_mm_movemask_epi8(symbol) != 0xffff)
			break;
	}
#endif
	while (i < len && symbol_value[s[i]] != 255)
		i++;
	return i;
}

int sk_b64_check(const char *in, size_t len, size_t *bad_at)
{
	const unsigned char *s = (const unsigned char *)in;
	if (len % 4 != 0) {
		*bad_at = len - len % 4;
		return -1;
	}
	if (len == 0)
		return 0;
	/* Every group but the last: each symbol in the alphabet ('=' included among the bad). */
	size_t body = len - 4;
	size_t k = symbol_run(s, body);
	if (k < body) {
		*bad_at = k;
		return -1;
	}
	/* The last group carries the padding rules: decoding it alone applies them. */
	unsigned char last[3];
	size_t n;
	if (sk_b64_decode(in + body, 4, last, &n) < 0) {
		*bad_at = body + n;
		return -1;
	}
	return 0;
}
