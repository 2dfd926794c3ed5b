package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The secret in these tests: a CI token in the environment lint runs in.
const ciToken = "ghp_s3cr3tCIt0ken"

// TestLintNeverPrintsEnvironmentValues: a recipe in a pull request that refers
// to a variable (data.path = "/x/${MY_CI_TOKEN}") made lint print the token, in
// text, JSON and SARIF. Every output, --explain and resolve show what the recipe
// wrote; the variable is named, its value never printed. The same holds for a
// variable reached through SHARDLINE_DATA_PATH or --set, and for run's error.
func TestLintNeverPrintsEnvironmentValues(t *testing.T) {
	env := []string{"MY_CI_TOKEN=" + ciToken}
	recipe := writeRecipe(t, "extends = \""+filepath.Join(mustAbs(t, recipesDir), "tiny.toml")+"\"\n[data]\npath = \"/x/${MY_CI_TOKEN}\"\n")
	for _, args := range [][]string{
		{"lint", recipe},
		{"lint", "--format", "json", recipe},
		{"lint", "--format", "sarif", recipe},
		{"lint", "--strict", recipe},
		{"lint", "--explain", "data.path", recipe},
		{"lint", recipe, "--set", "data.path=$MY_CI_TOKEN/y"},
		{"recipe", "resolve", recipe},
		{"plan", recipe},
		{"run", recipe, "--train-iters", "1", "--set", "run.output_dir=" + t.TempDir()},
	} {
		_, out, errs := shardline(t, env, args...)
		require.NotContains(t, out+errs, ciToken, "%v printed the token:\n%s%s", args, out, errs)
		require.Contains(t, out+errs, "MY_CI_TOKEN", "%v names the variable", args)
	}
	_, out, _ := shardline(t, env, "lint", recipe)
	require.Contains(t, out, `data.path ("/x/${MY_CI_TOKEN}") does not exist here (MY_CI_TOKEN expanded from the environment, whose values are not shown)`)

	// Through the SHARDLINE_DATA_PATH layer: the variable's value is the recipe
	// value as written; what it refers to is not expanded in the message.
	_, out, errs := shardline(t, append(env, "SHARDLINE_DATA_PATH=/y/${MY_CI_TOKEN}"), "lint", "--format", "sarif", recipe)
	require.NotContains(t, out+errs, ciToken)
}

// TestLintNeverQuotesFilesThatAreNotRecipes: extends pointing at a key or a
// password file read it and quoted its lines (a .env's token line under an
// "unknown key" finding). A base must be a .toml file; a file that has no
// recipe section at all is refused without decoding it; a syntax error does
// not quote the character it stopped at.
func TestLintNeverQuotesFilesThatAreNotRecipes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	write("id_rsa", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA"+ciToken+"\n-----END OPENSSH PRIVATE KEY-----\n")
	write("shadow", "root:$6$"+ciToken+":19000:0:99999:7:::\n")
	write("dotenv", "API_TOKEN = \""+ciToken+"\"\n")
	write("credentials.toml", "[registry]\ntoken = \""+ciToken+"\"\n")
	write("env.toml", "GITHUB_TOKEN = \""+ciToken+"\"\n[default]\naws_secret_access_key = \""+ciToken+"\"\n")
	write("key.toml", ciToken[:1]+"ey = \\q"+ciToken+"\n")
	for _, c := range []struct{ base, want string }{
		{"id_rsa", `extends "id_rsa" names no recipe: a base recipe is a .toml file`},
		{"shadow", `extends "shadow" names no recipe`},
		{"/etc/shadow", `extends "/etc/shadow" names no recipe`},
		{"dotenv", `extends "dotenv" names no recipe`},
		{"credentials.toml", "credentials.toml is not a shardline recipe: it has no recipe section and no extends (its first key is registry); its lines are not shown"},
		{"env.toml", "env.toml is not a shardline recipe"},
		{"key.toml", "TOML syntax error"},
	} {
		t.Run(c.base, func(t *testing.T) {
			r := write("r.toml", "extends = \""+c.base+"\"\n[model]\nlayers = 2\n")
			for _, format := range []string{"text", "json", "sarif"} {
				code, out, errs := shardline(t, nil, "lint", "--format", format, r)
				require.Equal(t, 1, code, "%s%s", out, errs)
				require.NotContains(t, out+errs, ciToken, "%s", format)
				require.NotContains(t, out+errs, "BEGIN OPENSSH", format)
				if format == "text" {
					require.Contains(t, out, c.want)
				}
			}
		})
	}
	// The file named on the command line is judged the same way (a symbolic link
	// named .toml in a linted directory).
	lintDir := filepath.Join(dir, "recipes")
	require.NoError(t, os.Mkdir(lintDir, 0o755))
	require.NoError(t, os.Symlink(filepath.Join(dir, "env.toml"), filepath.Join(lintDir, "evil.toml")))
	code, out, errs := shardline(t, nil, "lint", "--format", "sarif", lintDir)
	require.Equal(t, 1, code)
	require.NotContains(t, out+errs, ciToken)
	code, out, errs = shardline(t, nil, "lint", lintDir)
	require.Equal(t, 1, code)
	require.NotContains(t, out+errs, ciToken)
	require.True(t, strings.Contains(out, "is not a shardline recipe"), out)
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	require.NoError(t, err)
	return a
}
