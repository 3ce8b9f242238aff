/* base64.c — see base64.h. */
#include "base64.h"

#include <stdint.h>

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

void sk_b64_encode(const unsigned char *in, size_t len, char *out)
{
	size_t i = 0;
	for (; i + 3 <= len; i += 3) {
		uint32_t v = ((uint32_t)in[i] << 16) | ((uint32_t)in[i + 1] << 8) | in[i + 2];
		*out++ = alphabet[v >> 18];
		*out++ = alphabet[(v >> 12) & 63];
		*out++ = alphabet[(v >> 6) & 63];
		*out++ = alphabet[v & 63];
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
