// Tests of the LLM designer over real HTTP on loopback, through libcurl:
// the client's retries, timeouts and both API shapes against the replay
// server; the designer's reading of replies (JSON in prose or fences,
// invalid knobs, duplicates, budgets); and whole `ktune run --designer llm`
// sessions on the host backend, driven by a script of faults, re-run from
// their recorded replies by `ktune replay --serve`, and searched for the API
// key, which must appear nowhere.
#include <doctest/doctest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include "agent/designers.h"
#include "agent/llm_client.h"
#include "agent/replay_server.h"
#include "base/clock.h"
#include "base/fs.h"
#include "tests/agent_fixture.h"
#include "sandbox/process.h"
#include "traces/store.h"

using namespace ktune;
using namespace ktune::agent;

namespace {

const std::string kSecret = "sk-test-SECRET-12345";

std::string ktune_binary() {
  const char* dir = std::getenv("KTUNE_BINARY_DIR");
  return std::string(dir && *dir ? dir : KTUNE_BINARY_DIR) + "/ktune";
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string err;
    REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-llm-test-", &path, &err), err);
  }
  ~TempDir() { remove_tree(path); }
};

// A ReplayServer answering on its own thread for the length of a test.
class ServerThread {
 public:
  explicit ServerThread(std::vector<ScriptedResponse> script) : server_(std::move(script)) {
    std::string err;
    REQUIRE_MESSAGE(server_.bind(0, &err), err);
    thread_ = std::thread([this] { server_.serve(); });
  }
  ~ServerThread() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_.port()); }
  std::vector<ServedRequest> requests() const { return server_.requests(); }

 private:
  ReplayServer server_;
  std::thread thread_;
};

// Sets an environment variable for the length of a scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const std::string& n, const std::string& value) : name(n) { setenv(n.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

ScriptedResponse content(const std::string& text) {
  ScriptedResponse r;
  r.content = text;
  return r;
}
ScriptedResponse status(int code, double retry_after_s = -1) {
  ScriptedResponse r;
  r.status = code;
  r.retry_after_s = retry_after_s;
  return r;
}
ScriptedResponse delayed(double seconds) {
  ScriptedResponse r = content("too late");
  r.delay_s = seconds;
  return r;
}
ScriptedResponse raw_body(const std::string& body) {
  ScriptedResponse r;
  r.body = body;
  return r;
}
std::string knobs_reply(const json& knobs) { return json{{"rationale", "test"}, {"knobs", knobs}}.dump(); }

// ---- sessions run by the real ktune binary ------------------------------------------

// Runs a command of the built ktune with `env` as its whole environment.
sandbox::ProcessResult run_ktune(const std::vector<std::string>& args, const std::string& dir,
                                 const std::map<std::string, std::string>& env, double timeout_s) {
  sandbox::ProcessSpec spec;
  spec.argv = {ktune_binary()};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.workdir = dir;
  spec.env = env;
  spec.limits.timeout_s = timeout_s;
  spec.capture_bytes = 1 << 20;
  sandbox::ProcessResult r;
  std::string err;
  REQUIRE_MESSAGE(sandbox::run_process(spec, &r, &err), err);
  return r;
}

// The environment of a session: what it needs, plus the API key. (The
// sandbox's clean_env would drop the key; keeping it from variants is
// ktune's job, which these tests check.)
std::map<std::string, std::string> session_env() {
  std::map<std::string, std::string> env = {{"KTUNE_LLM_API_KEY", kSecret}, {"KTUNE_CACHE_DIR", cache_dir()}};
  for (const char* name : {"PATH", "HOME", "LANG", "TMPDIR"})
    if (const char* v = std::getenv(name)) env[name] = v;
  return env;
}

struct SessionRun {
  std::string db;
  sandbox::ProcessResult result;
};

// A short session of the llm designer on the host backend against `url`;
// the call limit ends it once the script is used.
SessionRun run_llm_session(const std::string& dir, const std::string& name, const std::string& url,
                           int max_calls) {
  SessionRun s;
  s.db = dir + "/" + name + ".sqlite";
  s.result = run_ktune({"run", "--designer", "llm", "--llm-api", "openai", "--llm-url", url, "--llm-model", "test",
                        "--llm-timeout", "1", "--llm-max-retries", "1", "--llm-max-calls", std::to_string(max_calls),
                        "--backend", "host", "--size", "small", "--budget", "150s", "--samples", "5", "--seed", "7",
                        "--db", s.db},
                       dir, session_env(), 240);
  INFO(s.result.describe() << "\n" << s.result.out << s.result.err);
  REQUIRE(s.result.ok());
  return s;
}

// Rows of a query on a session database, each column as text.
std::vector<std::vector<std::string>> query(const std::string& db, const std::string& sql) {
  traces::Store store;
  std::string err;
  REQUIRE_MESSAGE(store.open(db, &err), err);
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(store.handle(), sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
  std::vector<std::vector<std::string>> rows;
  while (sqlite3_step(st) == SQLITE_ROW) {
    std::vector<std::string> row;
    for (int i = 0; i < sqlite3_column_count(st); ++i) {
      const unsigned char* text = sqlite3_column_text(st, i);
      row.push_back(text ? reinterpret_cast<const char*>(text) : "");
    }
    rows.push_back(row);
  }
  sqlite3_finalize(st);
  return rows;
}

// The candidate variants of session 1, in attempt order.
std::vector<std::string> candidate_variants(const std::string& db) {
  std::vector<std::string> out;
  for (auto& row : query(db, "SELECT variant FROM attempts WHERE session_id = 1 AND purpose = 'candidate' ORDER BY seq"))
    out.push_back(row[0]);
  return out;
}

// The script of the recorded session: one answer of each kind, and calls
// of the designer (its call limit is kScriptCalls):
//  1 ok (JSON in a fenced block after prose)   2 malformed (no JSON)
//  3 empty                                     4 a 429, then ok on the retry
//  5 a timeout on both tries                   6 a source that does not compile
//  7 ok                                        8 a 200 whose body is not JSON
//  9 invalid knobs                             10 a duplicate of call 1
//  11 ok
constexpr int kScriptCalls = 11;
std::vector<ScriptedResponse> fault_script() {
  return {content("More threads should help.\n```json\n" + knobs_reply({{"threads", 4}}) + "\n```\n"),
          content("I think { this is not JSON"),
          content(""),
          status(429, 0),
          content(knobs_reply({{"tile", "128"}})),
          delayed(2.5),
          delayed(2.5),
          content(json{{"rationale", "a rewrite"}, {"source", "this is not C++ at all;\n"}}.dump()),
          content(knobs_reply({{"dequant", "direct"}})),
          raw_body("not json"),
          content(knobs_reply({{"tile", 7}})),
          content(knobs_reply({{"threads", 4}})),
          content(knobs_reply({{"unroll", 4}}))};
}

// The session driven by the fault script, run once and shared by the tests
// below (which read its database, its trace and its files).
struct Recorded {
  TempDir dir;
  double started_wall = 0;
  SessionRun run;
  std::vector<ServedRequest> requests;
};
const Recorded& recorded() {
  static std::unique_ptr<Recorded> r = [] {
    auto rec = std::make_unique<Recorded>();
    rec->started_wall = wall_seconds();
    ServerThread server(fault_script());
    rec->run = run_llm_session(rec->dir.path, "recorded", server.url(), kScriptCalls);
    rec->requests = server.requests();
    return rec;
  }();
  return *r;
}

bool contains_secret(const std::string& path) {
  std::string text, err;
  return read_file(path, &text, &err) && text.find(kSecret) != std::string::npos;
}

// Every file under `root` changed since `since` (wall seconds) that holds
// the key; `searched` counts the files read.
std::vector<std::string> files_with_secret(const std::string& root, double since, int* searched) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st {};
    if (!it->is_regular_file(ec) || stat(it->path().c_str(), &st) != 0 || st.st_mtime + 2 < since ||
        st.st_size > (64 << 20))
      continue;
    ++*searched;
    if (contains_secret(it->path())) found.push_back(it->path());
  }
  return found;
}

}  // namespace

TEST_CASE("llm client: both API shapes, retries on 429 and 5xx, timeouts, malformed bodies") {
  ServerThread server({content("hello"), status(429, 0), content("after a 429"), status(503), status(503), status(503),
                       delayed(3), delayed(3), raw_body("{\"not\": \"a chat completion\"}"), status(400),
                       content("from anthropic")});
  LlmClientOptions o;
  o.url = server.url();
  o.model = "test";
  o.timeout_s = 1;
  o.max_retries = 2;
  ScopedEnv key("KTUNE_LLM_API_KEY", kSecret);
  LlmClient openai;
  std::string err;
  REQUIRE_MESSAGE(openai.init(o, &err), err);
  CHECK(openai.endpoint() == server.url() + "/chat/completions");

  LlmReply r = openai.complete("system", "user", 30);
  CHECK(r.status == "ok");
  CHECK(r.text == "hello");
  CHECK(r.tokens_in > 0);
  CHECK(r.tokens_out == 1);
  CHECK(r.retries == 0);

  r = openai.complete("system", "user", 30);  // 429 (Retry-After: 0), then the answer
  CHECK(r.status == "ok");
  CHECK(r.text == "after a 429");
  CHECK(r.retries == 1);
  CHECK(r.error.empty());

  r = openai.complete("system", "user", 30);  // 503 on every try: 0.5 s + 1 s of backoff
  CHECK(r.status == "http_error");
  CHECK(r.http_status == 503);
  CHECK(r.retries == 2);
  CHECK(r.latency_s >= 1.4);

  o.max_retries = 1;
  LlmClient impatient;
  REQUIRE(impatient.init(o, &err));
  r = impatient.complete("system", "user", 30);  // slower than the timeout, twice
  CHECK(r.status == "timeout");
  CHECK(r.retries == 1);
  CHECK(r.latency_s < 4);  // 1 s + 0.5 s + 1 s, not the 3 s of each answer

  r = impatient.complete("system", "user", 30);
  CHECK(r.status == "malformed");
  CHECK(r.text.find("not") != std::string::npos);

  r = impatient.complete("system", "user", 30);  // a 400 is not retried
  CHECK(r.status == "http_error");
  CHECK(r.http_status == 400);
  CHECK(r.retries == 0);

  o.api = "anthropic";
  LlmClient anthropic;
  REQUIRE(anthropic.init(o, &err));
  CHECK(anthropic.endpoint() == server.url() + "/v1/messages");
  r = anthropic.complete("system", "user", 30);
  CHECK(r.status == "ok");
  CHECK(r.text == "from anthropic");

  std::vector<ServedRequest> seen = server.requests();
  REQUIRE(seen.size() == 11);
  for (const ServedRequest& s : seen) CHECK(s.authorized);
  CHECK(seen.back().api == "anthropic");
  CHECK(llm_endpoint("openai", "http://h:8000/v1/") == "http://h:8000/v1/chat/completions");
  CHECK(llm_endpoint("openai", "http://h/x/chat/completions") == "http://h/x/chat/completions");
  CHECK(llm_endpoint("anthropic", "https://api.anthropic.com/v1") == "https://api.anthropic.com/v1/messages");
}

TEST_CASE("llm designer: reads JSON in prose and fences, rejects invalid knobs and duplicates, keeps budgets") {
  ServerThread server({
      content("Here is my idea:\n```json\n" + knobs_reply({{"tile", "128"}, {"threads", 4}}) + "\n```\nGood luck."),
      // A source with raw newlines inside its JSON string, and braces in it.
      content("{\"rationale\": \"own loop\", \"source\": \"int f() {\n  return 0;\n}\n\"}"),
      content("I would use {tile} wisely. {\"rationale\": \"deeper unroll\", \"knobs\": {\"unroll\": 4}} That's all."),
      content(knobs_reply({{"no_such_knob", 1}})),
      content("{\"rationale\": \"I have no proposal\"}"),
      content(knobs_reply({{"threads", 4}, {"tile", 128}})),
      content(knobs_reply({{"mla", "absorbed"}})),
  });
  DesignContext ctx = testing::host_design_context();
  ctx.next_attempt = 5;
  std::vector<json> calls;
  ctx.record = [&](const std::string& kind, const json& data) {
    CHECK(kind == "llm_call");
    calls.push_back(data);
  };
  std::string err;
  auto designer = make_designer("llm", {{"api", "openai"}, {"url", server.url()}, {"model", "m"},
                                        {"token_budget", 100000}, {"max_calls", 7}}, &err);
  REQUIRE_MESSAGE(designer, err);

  std::vector<Proposal> out;
  REQUIRE(designer->propose(ctx, 6, &out, &err));
  REQUIRE(calls.size() == 6);
  std::vector<std::string> statuses;
  for (const json& c : calls) statuses.push_back(c["status"]);
  CHECK(statuses == std::vector<std::string>{"ok", "ok", "ok", "invalid_knobs", "malformed", "duplicate"});
  REQUIRE(out.size() == 3);
  CHECK(out[0].knobs["tile"] == 128);  // "128" read as the allowed value 128
  CHECK(out[0].knobs["threads"] == 4);
  CHECK(out[0].knobs["unroll"] == 2);  // the default
  CHECK(out[0].origin == "llm");
  CHECK(out[1].source == "int f() {\n  return 0;\n}\n");
  CHECK(out[2].knobs["unroll"] == 4);
  CHECK(out[2].rationale == "deeper unroll");
  CHECK(calls[0]["attempt"] == 5);
  CHECK(calls[0]["variant"] == ctx.variant_id(out[0].knobs, ""));
  CHECK(calls[2]["attempt"] == 7);
  CHECK_FALSE(calls[3].contains("attempt"));
  CHECK(calls[3]["error"].get<std::string>().find("no_such_knob") != std::string::npos);
  // Later prompts know what this step proposed and what was rejected.
  std::string last_prompt = calls[5]["prompt"];
  CHECK(last_prompt.find("Already proposed in this step") != std::string::npos);
  CHECK(last_prompt.find("- threads=4 tile=128") != std::string::npos);
  CHECK(last_prompt.find("invalid_knobs: unknown knob 'no_such_knob'") != std::string::npos);
  for (const json& c : calls) {
    CHECK(c["provider"] == "openai");
    CHECK(c["tokens_in"].get<int>() > 0);
    CHECK(c.dump().find(kSecret) == std::string::npos);
  }

  // The call limit: one more call, then the designer stops and says why.
  out.clear();
  REQUIRE(designer->propose(ctx, 2, &out, &err));
  CHECK(out.size() == 1);
  CHECK(calls.back()["status"] == "budget");
  out.clear();
  REQUIRE(designer->propose(ctx, 2, &out, &err));
  CHECK(out.empty());
  json usage = designer->usage();
  CHECK(usage["calls"] == 7);
  CHECK(usage["failed_calls"] == 3);
  CHECK(usage["by_status"]["ok"] == 4);
  CHECK(usage["by_status"]["budget"] == 1);
  CHECK(usage["tokens_in"].get<long>() > 0);
  CHECK(usage["stopped"].get<std::string>().find("7 model calls") != std::string::npos);
}

TEST_CASE("llm designer: the prompt shows what earlier sessions on the same code found") {
  ServerThread server({content(knobs_reply({{"unroll", 4}}))});
  DesignContext ctx = testing::host_design_context();
  std::vector<json> calls;
  ctx.record = [&](const std::string&, const json& data) { calls.push_back(data); };
  auto earlier = [&](const json& knobs, const std::string& outcome, double us, double speedup, const std::string& error) {
    ctx.earlier.push_back(testing::attempt_at(ctx, knobs, outcome, us, speedup, error));
  };
  earlier({{"threads", 4}}, "ok", 900.0, 12.5, "");
  earlier({{"tile", 16}}, "wrong_answer", 0, 0, "L0.S: cosine 0.2 below the gate");
  earlier({{"threads", 8}, {"tile", 128}}, "ok", 450.0, 25.0, "");
  std::string err;
  auto designer = make_designer("llm", {{"api", "openai"}, {"url", server.url()}, {"model", "m"}}, &err);
  REQUIRE_MESSAGE(designer, err);
  std::vector<Proposal> out;
  REQUIRE(designer->propose(ctx, 1, &out, &err));
  REQUIRE(calls.size() == 1);
  const std::string prompt = calls[0]["prompt"];
  INFO(prompt);
  const size_t section = prompt.find("# Earlier sessions on this code (3 attempts;");
  REQUIRE(section != std::string::npos);
  const size_t fast = prompt.find("threads=8 tile=128 | ok | 450.0 | 25.00x |", section);
  const size_t slower = prompt.find("threads=4 | ok | 900.0 | 12.50x |", section);
  const size_t failed = prompt.find("tile=16 | wrong_answer |  |  | L0.S: cosine 0.2 below the gate", section);
  CHECK(fast != std::string::npos);
  CHECK(slower != std::string::npos);
  CHECK(failed != std::string::npos);
  CHECK(fast < slower);  // fastest first, then the failures
  CHECK(slower < failed);

  // Without earlier sessions there is no such section.
  ServerThread again({content(knobs_reply({{"unroll", 4}}))});
  ctx.earlier.clear();
  calls.clear();
  auto fresh = make_designer("llm", {{"api", "openai"}, {"url", again.url()}, {"model", "m"}}, &err);
  REQUIRE(fresh->propose(ctx, 1, &out, &err));
  REQUIRE(calls.size() == 1);
  CHECK(calls[0]["prompt"].get<std::string>().find("# Earlier sessions") == std::string::npos);
}

TEST_CASE("llm designer: a token budget stops it; a failed round is a designer failure the session survives") {
  // Each call costs 1500 tokens in and 10 out, as the server says.
  std::vector<ScriptedResponse> script = {content(knobs_reply({{"tile", 32}})), content("no JSON here")};
  for (ScriptedResponse& r : script) r.tokens_in = 1500, r.tokens_out = 10;
  ServerThread server(script);
  DesignContext ctx = testing::host_design_context();
  std::vector<json> calls;
  ctx.record = [&](const std::string&, const json& data) { calls.push_back(data); };
  std::string err;
  auto designer = make_designer("llm", {{"api", "openai"}, {"url", server.url()}, {"model", "m"},
                                        {"source_chars", 0}, {"token_budget", 2000}}, &err);
  REQUIRE_MESSAGE(designer, err);
  std::vector<Proposal> out;
  REQUIRE(designer->propose(ctx, 1, &out, &err));
  CHECK(out.size() == 1);
  CHECK(calls[0]["prompt"].get<std::string>().find("accepts knob settings only") != std::string::npos);
  out.clear();
  CHECK_FALSE(designer->propose(ctx, 1, &out, &err));  // malformed: nothing proposed, and why
  CHECK(err.find("malformed") != std::string::npos);
  out.clear();
  REQUIRE(designer->propose(ctx, 1, &out, &err));  // 3020 tokens used
  CHECK(out.empty());
  CHECK(calls.back()["status"] == "budget");
  CHECK(calls.back()["error"].get<std::string>().find("token budget of 2000 was used (3020 tokens)") !=
        std::string::npos);
  CHECK(designer->usage()["tokens_in"] == 3000);
}

TEST_CASE("llm session on loopback: every kind of failure is recorded and the session goes on") {
  const Recorded& rec = recorded();
  const std::string& db = rec.run.db;
  INFO(rec.run.result.out);
  auto session = query(db, "SELECT status, end_reason, info FROM sessions WHERE id = 1");
  REQUIRE(session.size() == 1);
  CHECK(session[0][0] == "completed");
  CHECK(session[0][1] == "the designer has nothing left to propose");
  json options = json::parse(session[0][2])["options"]["designer_options"];
  CHECK(options["model"] == "test");
  CHECK(options["max_calls"] == kScriptCalls);

  auto calls = query(db, "SELECT status, retries, http_status, IFNULL(attempt, 0), tokens_in, error "
                         "FROM llm_calls WHERE session_id = 1 ORDER BY id");
  std::vector<std::string> statuses;
  for (auto& c : calls) statuses.push_back(c[0]);
  CHECK(statuses == std::vector<std::string>{"ok", "malformed", "empty", "ok", "timeout", "ok", "ok", "malformed",
                                             "invalid_knobs", "duplicate", "ok", "budget"});
  REQUIRE(calls.size() == 12);
  CHECK(calls[3][1] == "1");        // the 429 was retried once, then ok
  CHECK(calls[4][1] == "1");        // the timeout too, then given up
  CHECK(calls[4][5].find("timed out") != std::string::npos);
  CHECK(calls[7][5].find("not a chat completion") != std::string::npos);
  CHECK(calls[8][5].find("'tile' = 7") != std::string::npos);
  CHECK(std::stoi(calls[0][4]) > 1000);  // the prompt's tokens

  // Each ok call is linked to the attempt of the variant it proposed.
  auto attempts = query(db, "SELECT a.seq, a.outcome, v.origin FROM attempts a JOIN variants v ON v.id = a.variant "
                            "WHERE a.session_id = 1 AND a.purpose = 'candidate' ORDER BY a.seq");
  REQUIRE(attempts.size() == 5);
  std::vector<std::string> linked;
  for (auto& c : calls)
    if (c[0] == "ok") linked.push_back(c[3]);
  std::vector<std::string> seqs;
  for (auto& a : attempts) {
    seqs.push_back(a[0]);
    CHECK(a[2] == "llm");
  }
  CHECK(linked == seqs);
  auto same_variant = query(db, "SELECT count(*) FROM events e JOIN attempts a ON a.session_id = e.session_id "
                                "AND a.seq = e.attempt WHERE e.kind = 'llm_call' "
                                "AND a.variant = json_extract(e.data, '$.variant')");
  CHECK(same_variant[0][0] == "5");
  // The source that does not compile is an attempt like any other, and
  // later attempts follow it.
  CHECK(attempts[2][1] == "compile_error");
  CHECK(attempts[3][1] == "ok");
  CHECK(attempts[4][1] == "ok");

  // Token totals in the summary.
  auto summary = query(db, "SELECT summary FROM sessions WHERE id = 1");
  json designer = json::parse(summary[0][0])["designer"];
  CHECK(designer["calls"] == kScriptCalls);
  CHECK(designer["tokens_in"].get<long>() > 10000);
  CHECK(designer["by_status"]["timeout"] == 1);

  // The key went to the API (in its header) on every request.
  REQUIRE_FALSE(rec.requests.empty());
  for (const ServedRequest& r : rec.requests) CHECK(r.authorized);
}

TEST_CASE("llm session replay: `ktune replay --serve` re-runs a recorded session to the same variants") {
  const Recorded& rec = recorded();
  TempDir dir;
  const std::string trace = dir.path + "/recorded.jsonl";
  auto exported = run_ktune({"trace", "export", "--db", rec.run.db, "1", "--out", trace}, dir.path, session_env(), 60);
  REQUIRE_MESSAGE(exported.ok(), exported.err);

  sandbox::LineChild server;
  sandbox::ProcessSpec spec;
  spec.argv = {ktune_binary(), "replay", trace, "--serve", "--port", "0", "--max-requests",
               std::to_string(kScriptCalls)};
  spec.workdir = dir.path + "/server";
  spec.env = sandbox::clean_env(spec.workdir);
  std::string err, line;
  REQUIRE_MESSAGE(server.start(spec, dir.path + "/server.err", &err), err);
  bool timed_out = false;
  REQUIRE_MESSAGE(server.receive(&line, 20, &timed_out, &err), err);
  const std::string prefix = "serving on ";
  REQUIRE(line.rfind(prefix, 0) == 0);
  const std::string url = line.substr(prefix.size());

  SessionRun replay = run_llm_session(dir.path, "replay", url, kScriptCalls);
  std::vector<std::string> recorded_variants = candidate_variants(rec.run.db);
  CHECK(recorded_variants.size() == 5);
  CHECK(candidate_variants(replay.db) == recorded_variants);
  // The same answers, read the same way (the recorded timeout is answered
  // at once as a failed call).
  auto statuses = query(replay.db, "SELECT group_concat(status, ' ') FROM (SELECT status FROM llm_calls ORDER BY id)");
  CHECK(statuses[0][0] == "ok malformed empty ok http_error ok ok malformed invalid_knobs duplicate ok budget");

  // The server answered every recorded call, then exited.
  std::string summary;
  while (server.receive(&line, 20, &timed_out, &err)) summary += line + "\n";
  CHECK(summary.find("answered 11 request(s) from the script") != std::string::npos);
}

TEST_CASE("llm secrets: the API key is in no database, trace, log, work file or output") {
  const Recorded& rec = recorded();
  const std::string& db = rec.run.db;
  for (const std::string& f : {db, db + "-wal", db + "-shm"}) CHECK_FALSE(contains_secret(f));
  TempDir dir;
  const std::string trace = dir.path + "/trace.jsonl";
  auto exported = run_ktune({"trace", "export", "--db", db, "1", "--out", trace}, dir.path, session_env(), 60);
  REQUIRE(exported.ok());
  std::string text, err;
  REQUIRE(read_file(trace, &text, &err));
  CHECK(text.find("\"llm_call\"") != std::string::npos);
  CHECK(text.find(kSecret) == std::string::npos);
  CHECK(rec.run.result.out.find(kSecret) == std::string::npos);
  CHECK(rec.run.result.err.find(kSecret) == std::string::npos);
  // The session's work directory (runner log, sandbox) and the builds it made.
  int searched = 0;
  for (const char* sub : {"work", "builds"}) {
    std::vector<std::string> found = files_with_secret(join_path(cache_dir(), sub), rec.started_wall, &searched);
    CHECK_MESSAGE(found.empty(), "the key is in " << (found.empty() ? "" : found[0]));
  }
  CHECK(searched > 0);  // the runner's log at least
}
