// Progress lines on stderr for long stages ("[compress] layer 2/4 expert 17/32 ...").
// Silenced by MOESQ_QUIET=1 so that tests and scripts keep clean logs; stdout stays for results.
#pragma once
#include <string>

namespace moesq {

void progress(const std::string& stage, const std::string& message);
bool progress_enabled();
void set_progress_enabled(bool on);

}  // namespace moesq
