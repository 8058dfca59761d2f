// Placeholder until the LLM designer lands (issue 5).
#include "agent/designers.h"

namespace ktune::agent {

std::unique_ptr<Designer> make_llm_designer(const json&, std::string* err) {
  *err = "the llm designer is not built into this ktune yet";
  return nullptr;
}

}  // namespace ktune::agent
