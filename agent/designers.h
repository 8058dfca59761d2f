// The designers a session can use, by name: "search" (the default), "replay"
// (the proposals of a recorded session, or a scripted list) and "llm" (a
// language model through its API).
#pragma once
#include <memory>
#include <string>

#include "agent/designer.h"

namespace ktune::agent {

// replay options: {"trace": "s.jsonl"} or {"proposals": [{template?, knobs?, source?, rendered?, rationale?}]}
std::unique_ptr<Designer> make_replay_designer(const json& options, std::string* err);
std::unique_ptr<Designer> make_llm_designer(const json& options, std::string* err);

std::unique_ptr<Designer> make_designer(const std::string& name, const json& options, std::string* err);

}  // namespace ktune::agent
