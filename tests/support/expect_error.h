// EXPECT_ERROR_CONTAINING(statement, "substring"): the statement throws moesq::Error and its message
// contains the substring (the argument check names the problem, not just "bad argument").
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

#define EXPECT_ERROR_CONTAINING(statement, substring)                                              \
  do {                                                                                             \
    try {                                                                                          \
      statement;                                                                                   \
      ADD_FAILURE() << #statement " did not throw; expected an Error containing \"" << (substring) \
                    << "\"";                                                                       \
    } catch (const ::moesq::Error& e_) {                                                           \
      EXPECT_NE(std::string(e_.what()).find(substring), std::string::npos)                         \
          << "message \"" << e_.what() << "\" does not contain \"" << (substring) << "\"";         \
    }                                                                                              \
  } while (0)
