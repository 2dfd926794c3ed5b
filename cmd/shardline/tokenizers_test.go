package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/trainer/data"
	"github.com/stretchr/testify/assert"
)

// The recipe's data.tokenizer enum (config cannot import trainer/data) must name
// exactly the tokenizers data builds.
func TestTokenizerNamesAgree(t *testing.T) {
	f, ok := reflect.TypeFor[config.Data]().FieldByName("Tokenizer")
	assert.True(t, ok)
	assert.Equal(t, strings.Join(data.Tokenizers, ","), f.Tag.Get("enum"))
}
